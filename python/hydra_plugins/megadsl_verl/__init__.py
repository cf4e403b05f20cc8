"""Puts megadsl's verl config groups (megadsl/verl/groups: engine/megadsl, model_engine/megadsl,
actor/megadsl_actor, ref/megadsl_ref, critic/megadsl_critic) on the search path of every hydra
application, so verl's trainers take `engine=megadsl` and `model_engine=megadsl` with no
`hydra.searchpath`. Hydra finds this plugin in the `hydra_plugins` namespace package; it imports
neither megadsl nor torch."""

import importlib.util
import os

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class MegadslVerlSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        spec = importlib.util.find_spec("megadsl")
        if spec is None or not spec.submodule_search_locations:
            return
        config = os.path.join(list(spec.submodule_search_locations)[0], "verl", "groups")
        if os.path.isdir(config):
            search_path.append(provider="megadsl", path=f"file://{config}")
