"""A CPU platform for verl, for the tests only (verl 0.9 has none): loaded through verl's own plugin
hook, ``VERL_USE_EXTERNAL_MODULES=verl_cpu`` with ``VERL_PLATFORM=cpu`` (this folder on PYTHONPATH).

verl's trainers and workers ask the platform for a device name, a torch device module, a
communication backend and a device index; on the CPU these are "cpu", a module whose memory
queries answer 0, Gloo and the device "cpu". verl joins backends as "cpu:gloo,<device>:<backend>",
which torch refuses when both are the CPU's, so ``init_process_group`` is given "cpu:gloo" then.
Nothing here is megadsl's: the library needs no shim, only verl's own trainers do on this machine.
"""

import types
from contextlib import contextmanager

import torch
import torch.distributed as dist
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry


def _zero(*_args, **_kwargs):
    return 0


def _nothing(*_args, **_kwargs):
    return None


# torch.cpu has no memory statistics; verl's metrics ask for them (perf/max_memory_allocated_gb).
cpu_module = types.SimpleNamespace(
    is_available=lambda: True, device_count=lambda: 1, current_device=lambda: "cpu", set_device=_nothing,
    synchronize=_nothing, empty_cache=_nothing, manual_seed=torch.manual_seed, manual_seed_all=torch.manual_seed,
    max_memory_allocated=_zero, max_memory_reserved=_zero, memory_allocated=_zero, memory_reserved=_zero,
    reset_peak_memory_stats=_nothing, get_rng_state=torch.get_rng_state, set_rng_state=torch.set_rng_state,
    mem_get_info=lambda *_: (0, 0), get_device_name=lambda *_: "CPU", is_initialized=lambda: True,
    Stream=None, Event=None, current_stream=_nothing, stream=contextmanager(lambda *_: (yield)))


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    @property
    def device_name(self):
        return "cpu"

    @property
    def vendor_name(self):
        return "cpu"

    @property
    def device_module(self):
        return cpu_module

    def is_available(self):
        return True

    def current_device(self):
        return "cpu"  # what verl passes to .to(...) and torch.device(...)

    def device_count(self):
        return 1

    def set_device(self, device_index):
        pass

    def synchronize(self, device_index=None):
        pass

    def manual_seed(self, seed):
        torch.manual_seed(seed)

    def manual_seed_all(self, seed):
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings):
        pass

    def empty_cache(self):
        pass

    def get_device_capability(self, device_index=0):
        return None, None

    def communication_backend_name(self):
        return "gloo"

    def visible_devices_envvar(self):
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg):
        yield

    def profiler_start(self):
        pass

    def profiler_stop(self):
        pass

    def ray_resource_name(self):
        return "CPU"

    def ray_resource_options(self, num_gpus):
        return {}

    def ray_noset_envvars(self):
        return []

    def is_ipc_supported(self):
        return False

    def rollout_env_vars(self):
        return {}

    def get_collective_module(self):
        return None

    def cudart(self):
        return None


_init_process_group = dist.init_process_group


def _init_cpu_process_group(*args, backend=None, **kwargs):
    if backend == "cpu:gloo,cpu:gloo":
        backend = "cpu:gloo"
    return _init_process_group(*args, backend=backend, **kwargs)


dist.init_process_group = _init_cpu_process_group

# verl's FSDP reference model offloads with CPUOffloadPolicy(pin_memory=True); pinned memory needs a
# CUDA driver. On the CPU its tensors stay as they are.
if not torch.cuda.is_available():
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self


def _value_models_without_flash_attention():
    """verl's FSDP engine loads a value model with attn_implementation="flash_attention_2", which needs
    the flash-attn package and a GPU; on the CPU it gets torch's SDPA, the same math."""
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        return
    from transformers import AutoModelForTokenClassification

    load = AutoModelForTokenClassification.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "sdpa"
        return load(cls, *args, **kwargs)

    AutoModelForTokenClassification.from_pretrained = classmethod(from_pretrained)


_value_models_without_flash_attention()


def _engines_on_the_cpu():
    """verl registers its FSDP engines for its accelerators only; on this platform they run on the
    CPU (torch's FSDP2 over Gloo), so a backend without a "cpu" registration takes its "cuda" one."""
    from verl.workers.engine.base import EngineRegistry

    lookup = EngineRegistry.get_engine_cls.__func__

    def get_engine_cls(cls, model_type, backend):
        registry = cls._engines.get(model_type, {}).get(backend, {})
        if "cpu" not in registry and "cuda" in registry:
            return registry["cuda"]
        return lookup(cls, model_type, backend)

    EngineRegistry.get_engine_cls = classmethod(get_engine_cls)


_engines_on_the_cpu()
