"""The evaluator's embedded policy servers: the ``dz-gym-serve`` processes a run starts when it names a policy
instead of a server.

:class:`EmbeddedServers` is a context manager over what a config asks for: with no ``servers``, one server for
``policy`` (and one for ``policy_b`` in an A/B run); in a run of named arms (``--arm``) one per arm that names a
policy (an arm that names a URL is used as it is). Every server is a ``dz-gym-serve --flavor vllm-omni --quiet``
subprocess in a session of its own (a Ctrl-C in the terminal reaches only the evaluator, which stops them), on a
free loopback port; ``serve_args`` are extra ``dz-gym-serve`` arguments for all of them (a ``--flavor`` among
them picks another flavor, reached on its profile's path: ``/openpi/policy`` for ``sglang``). On exit (also after an
error or Ctrl-C) every started server is stopped, in reverse order.

After entering: ``servers`` and ``servers_b`` (arm A's and arm B's URLs), ``arm_servers`` (per named arm its URLs,
None without ``--arm``) and ``info`` (the summary's ``server`` entry: embedded or not, policy, flavor, URLs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dz_gym.eval.config import EvalConfig
from dz_gym.eval.plan import is_url
from dz_gym.protocol.profiles import PROFILES

__all__ = ["FLAVOR", "EmbeddedServers"]

FLAVOR = "vllm-omni"


def served_flavor(serve_args: Sequence[str]) -> str:
    """The flavor the embedded servers run: the last ``--flavor`` of ``serve_args`` (as ``dz-gym-serve`` reads
    them), else :data:`FLAVOR`.

    >>> served_flavor(["--latency-ms", "5", "--flavor=sglang"]), served_flavor([])
    ('sglang', 'vllm-omni')
    """
    flavor = FLAVOR
    args = list(serve_args)
    for k, arg in enumerate(args):
        if arg == "--flavor" and k + 1 < len(args):
            flavor = args[k + 1]
        elif arg.startswith("--flavor="):
            flavor = arg.partition("=")[2]
    return flavor if flavor in PROFILES else FLAVOR  # dz-gym-serve itself refuses an unknown one


class EmbeddedServers:
    """The servers ``config`` needs started (see the module docstring); ``say`` gets one line per server."""

    def __init__(self, config: EvalConfig, serve_args: Sequence[str] = (), say: Callable[[str], None] = print):
        self.config = config
        self.serve_args = list(serve_args)
        self.say = say
        self.started: list[Any] = []
        self.servers: list[str] = list(config.policies.servers)
        self.servers_b: list[str] = list(config.policies.servers_b)
        self.arm_servers: dict[str, list[str]] | None = None
        self.info: dict[str, Any] = {"embedded": not config.policies.servers}
        self.flavor = served_flavor(self.serve_args)

    def _start(self, policy: str) -> str:
        from dz_gym.server.launch import start_server_process

        argv = ["--policy", policy, "--flavor", FLAVOR, "--quiet", *self.serve_args]
        server = start_server_process(argv, new_session=True)
        self.started.append(server)
        return server.url + PROFILES[self.flavor].url_path

    def __enter__(self) -> EmbeddedServers:
        try:
            if self.config.policies.arm_specs:
                self._start_arms()
            elif not self.servers:
                self._start_ab()
        except BaseException:
            self.close()
            raise
        return self

    def _start_arms(self) -> None:
        arms: dict[str, dict[str, Any]] = {}
        self.arm_servers = {}
        for name, value in self.config.arm_table():
            if is_url(value):
                self.arm_servers[name] = [value]
                arms[name] = {"url": value}
                continue
            url = self._start(value)
            self.arm_servers[name] = [url]
            arms[name] = {"policy": value, "url": url, "flavor": self.flavor}
            self.say(f"arm {name}: started an embedded reference server (policy {value}) at {url}")
        self.info.update(arms=arms, embedded=any("policy" in entry for entry in arms.values()))
        self.servers = [url for urls in self.arm_servers.values() for url in urls]

    def _start_ab(self) -> None:
        config = self.config
        policies = [config.policies.policy] + ([config.policies.policy_b] if config.ab else [])
        urls = [self._start(policy) for policy in policies]  # an A/B run: one per arm, the same flavor and args
        self.servers, self.servers_b = urls[:1], urls[1:]
        self.info.update(
            policy=config.policies.policy, flavor=self.flavor, serve_args=list(self.serve_args), url=urls[0]
        )
        if config.ab:
            self.info.update(policy_b=config.policies.policy_b, url_b=urls[1])
            self.say(f"no --server given; started two embedded reference servers: arm A (policy {config.policies.policy}) "
                     f"at {urls[0]}, arm B (policy {config.policies.policy_b}) at {urls[1]}")  # fmt: skip
        else:
            self.say(
                f"no --server given; started the embedded reference server (policy {config.policies.policy}) at {urls[0]}"
            )

    def close(self) -> None:
        """Stop every server started, last first."""
        while self.started:
            self.started.pop().stop()

    def __exit__(self, *exc: Any) -> None:
        self.close()
