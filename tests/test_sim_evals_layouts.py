"""Which sim-evals layout the source says, before launch (:func:`dz_gym.envs.isaac.tasks.read_sim_evals`): only
registered gym ids count, however the registration spells them.

Each case writes the names and the structure the detector reads, not the upstream text. The fea59e52 case
models ``arhanjain/sim-evals`` at fea59e52: ``droid_environment.py`` defines ``DROID_SCENES``, a dict keyed by
16 ids (``"DROID-CubeInBowl"``, ``"DROID-CanInMug"``, ``"DROID-BananaInBin"``, ``"DROID-Berkeley-Task1"``, ...,
``"DROID-MILA-Task1"``, ...), read by ``get_scene_spec(env_id)``, which ``EnvCfg.set_scene(self, env_id: str)``
and ``SceneCfg.dynamic_scene`` call; the file has no ``register`` call. That commit's ``__init__.py`` was not
available to read: it is modelled as registering ``DROID`` alone (``EnvCfg`` as its entry point), as the
``droid_environment.py`` layout's ``__init__.py`` does.
"""

from __future__ import annotations

import textwrap

import pytest

from dz_gym.envs import scenes
from dz_gym.envs.isaac import tasks

FEA59E52_IDS = (
    "DROID-CubeInBowl", "DROID-CanInMug", "DROID-BananaInBin", "DROID-Berkeley-Task1", "DROID-UPenn-FrankaKitchen",
    "DROID-UPenn-TeaRoom", "DROID-UPenn-LivingRoom", "DROID-UTAustin-Task1", "DROID-UTAustin-Task2",
    "DROID-UTAustin-Task3", "DROID-Yonsei-Task1", "DROID-Yonsei-Task2", "DROID-MILA-Task1", "DROID-MILA-Task2",
    "DROID-FrodoBots-Task1", "DROID-FrodoBots-Task2",
)  # fmt: skip


def _package(tmp_path, files: dict[str, str]):
    environments = tmp_path / "sim_evals" / "environments"
    for name, text in files.items():
        (environments / name).parent.mkdir(parents=True, exist_ok=True)
        (environments / name).write_text(textwrap.dedent(text))
    return tmp_path / "sim_evals"


def _fea59e52(tmp_path):
    entries = "\n".join(f"    {i!r}: DroidSceneSpec('prompt', ('Scene.usd',))," for i in FEA59E52_IDS)
    return _package(
        tmp_path,
        {
            "__init__.py": """
                import gymnasium as gym
                from .droid_environment import EnvCfg as DroidEnvCfg
                gym.register(id="DROID", entry_point="isaaclab.envs:ManagerBasedRLEnv",
                             kwargs={"env_cfg_entry_point": DroidEnvCfg}, disable_env_checker=True)
            """,
            "droid_environment.py": f"DROID_SCENES = {{\n{entries}\n}}\n"
            + textwrap.dedent("""
                def get_scene_spec(env_id: str):
                    return DROID_SCENES[env_id]

                class SceneCfg:
                    def dynamic_scene(self, env_id: str) -> dict:
                        return {"scene_env_id": env_id, "spec": get_scene_spec(env_id)}

                class EnvCfg:
                    def set_scene(self, env_id: str):
                        self.scene_env_id = env_id
            """),
        },
    )


def test_fea59e52_registers_droid_alone_and_takes_the_scene_id_in_set_scene(tmp_path):
    installed = tasks.read_sim_evals(_fea59e52(tmp_path))
    assert installed.gym_ids == {"DROID"}  # DROID_SCENES' keys are looked up, not registered
    assert installed.set_scene_takes == "str" and not installed.unresolved and not installed.has_droid_package
    for scene in (1, 2, 3):
        assert installed.layout_for(scenes.task_for(scene)) == "droid_by_id"
    assert tasks.detect_layout(tmp_path / "sim_evals") == ("droid_by_id", False)


def test_a_loop_over_a_dict_of_another_file_registers_its_keys(tmp_path):  # 711ff04's droid/ package
    package = _package(
        tmp_path,
        {
            "__init__.py": "from . import droid\n",
            "droid/scenes.py": "DROID_SCENES: dict = {'DROID-CubeInBowl': 1, 'DROID-CanInMug': 2, 'DROID-BananaInBin': 3}\n",
            "droid/__init__.py": """
                import gymnasium as gym
                from .scenes import DROID_SCENES
                for _scene_id in DROID_SCENES:
                    if _scene_id in gym.registry:
                        continue
                    gym.register(id=_scene_id, entry_point="isaaclab.envs:ManagerBasedRLEnv")
            """,
            "droid/env_cfg.py": "class DroidEnvCfg:\n    def set_scene(self, scene_id: str):\n        return self\n",
        },
    )
    installed = tasks.read_sim_evals(package)
    assert installed.gym_ids == {"DROID-CubeInBowl", "DROID-CanInMug", "DROID-BananaInBin"}
    assert installed.layout_for(scenes.task_for(2)) == "per_scene" and installed.has_droid_package


def test_a_registering_helper_called_over_items_counts_its_ids(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": """
                import gymnasium as gym
                _CFGS = {"DROID": object, "DROID-CubeInBowl": object, "DROID-CanInMug": object}

                def _register_droid_env(env_id, cfg):
                    if env_id in gym.envs.registry:
                        return
                    gym.register(id=env_id, entry_point="isaaclab.envs:ManagerBasedRLEnv", kwargs={"cfg": cfg})

                for env_id, cfg in _CFGS.items():
                    _register_droid_env(env_id, cfg)
            """,
        },
    )
    installed = tasks.read_sim_evals(package)
    assert installed.gym_ids == {"DROID", "DROID-CubeInBowl", "DROID-CanInMug"} and not installed.unresolved
    assert installed.layout_for(scenes.task_for(1)) == "per_scene"
    assert installed.layout_for(scenes.task_for(3)) == "run_eval"  # DROID, and no set_scene that says str


def test_ids_the_source_does_not_spell_out_leave_the_layout_to_the_registry(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": """
                import gymnasium as gym
                from .droid_environment import DROID_SCENES
                for spec in DROID_SCENES.values():
                    gym.register(id=spec.env_id, entry_point="isaaclab.envs:ManagerBasedRLEnv")
            """,
            "droid_environment.py": "DROID_SCENES = {'DROID-CubeInBowl': None}\n",
        },
    )
    installed = tasks.read_sim_evals(package)
    assert installed.unresolved and installed.gym_ids == frozenset()
    assert installed.layout_for(scenes.task_for(1)) == "run_eval"  # the file layout's guess, confirmed at launch
    assert tasks.confirm_layout("run_eval", scenes.task_for(1), {"DROID-CubeInBowl": None}) == "per_scene"


@pytest.mark.parametrize(
    "text", ["gym.register(id=make_id(), entry_point=None)\n", "for i in ids():\n    register(i)\n"]
)
def test_unreadable_registrations_are_unresolved_not_guessed(tmp_path, text):
    installed = tasks.read_sim_evals(_package(tmp_path, {"__init__.py": text}))
    assert installed.unresolved and not installed.gym_ids
