"""megadsl as a verl engine: verl 0.9's ``BaseEngine`` behind ``EngineRegistry`` (backend "megadsl"),
and the config groups verl's hydra trainers select it with.

From verl's command line (the groups ship in megadsl/verl/groups; the hydra plugin
``hydra_plugins.megadsl_verl`` puts them on verl's search path):

    torchrun -m verl.trainer.sft_trainer engine=megadsl engine.tensor_model_parallel_size=2 ...
    python -m verl.trainer.main_ppo model_engine=megadsl actor_rollout_ref.actor.megadsl.tensor_model_parallel_size=2 ...

From Python:

    import megadsl.verl      # registers the engines: language_model and value_model, on cuda and cpu
    engine = EngineRegistry.new(model_type="language_model", backend="megadsl", model_config=HFModelConfig(path=...),
                                engine_config=megadsl.verl.MegadslEngineConfig(tensor_model_parallel_size=2),
                                optimizer_config=FSDPOptimizerConfig(lr=1e-6, ...), checkpoint_config=CheckpointConfig())
    engine.get_data_parallel_rank()          # answers at once: the layout is built at construction
    engine.initialize()                      # the model, AdamW, the schedule
    with engine.train_mode():
        out = engine.train_batch(data, loss_function=partial(ppo_loss, config=actor_config))
        lr = engine.lr_scheduler_step()

verl is needed only here (``import megadsl`` does not import it).
"""

from verl.workers.engine.base import EngineRegistry

from .config import MegadslActorConfig, MegadslCriticConfig, MegadslEngineConfig
from .engine import MegadslEngine, join_torch_job

__all__ = ["MegadslEngineConfig", "MegadslActorConfig", "MegadslCriticConfig", "MegadslEngine",
           "MegadslEngineWithLMHead", "MegadslEngineWithValueHead", "join_torch_job"]


def _register(model_type, critic):
    """The engine class of model_type, registered once (a second import of this module, e.g. by
    verl's plugin discovery and a config's _target_, finds it registered)."""
    registered = EngineRegistry._engines.get(model_type, {}).get("megadsl", {})
    if "cpu" in registered:
        return registered["cpu"]
    cls = type("MegadslEngineWithValueHead" if critic else "MegadslEngineWithLMHead", (MegadslEngine,),
               {"critic": critic, "__module__": __name__,
                "__doc__": "The critic: one value per token from the value head (HF's *ForTokenClassification score)."
                if critic else "The actor (and reference): log-probs and entropy of the next token."})
    return EngineRegistry.register(model_type=model_type, backend="megadsl", device=["cuda", "cpu"])(cls)


MegadslEngineWithLMHead = _register("language_model", critic=False)
MegadslEngineWithValueHead = _register("value_model", critic=True)
