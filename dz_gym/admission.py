"""What the wrapper knows of its servers' session admission: which envs wait after a refusal, until when,
and how many sessions each server admitted (no I/O).

A server that caps resident sessions (vLLM-Omni's proposed ``SessionAdmissionError``, the reference server's
``--max-sessions``) refuses the first request of a session beyond its cap; nothing ran, so the env may ask
again once another session is freed. :class:`Admission` keeps, per env, its run of refusals: the wait before
the next try doubles from ``TransportConfig.admission_backoff`` (the rule is
:func:`dz_gym.transport.rules.admission_retry_delay`), and past ``admission_wait`` seconds the env gives up
and the refusal is reported as a failure. It logs the first refusal of each server once, with the number of
this run's sessions that server had admitted, and keeps the most it admitted at once.

>>> from dz_gym.errors import SessionRefused
>>> from dz_gym.transport import TransportConfig
>>> admission = Admission(TransportConfig(admission_backoff=1.0))
>>> admission.admitted(0, "ws://a"), admission.admitted(1, "ws://a")
(None, None)
>>> error = admission.refused(2, "ws://a", SessionRefused("SessionAdmissionError"), now=100.0)
>>> admission.retry_at(2), admission.may_ask(2, now=100.5), admission.may_ask(2, now=101.0)
(101.0, False, True)
>>> admission.peak
{'ws://a': 2}
"""

from __future__ import annotations

import dataclasses
import logging
import time

from dz_gym.errors import DzGymError, SessionRefused
from dz_gym.transport import TransportConfig

__all__ = ["Admission"]

logger = logging.getLogger("dz_gym.wrapper")


@dataclasses.dataclass
class _Refusals:
    """One env's run of refused sessions: when the first came, how many, and when it may ask again."""

    first_at: float
    count: int = 0
    retry_at: float = 0.0


class Admission:
    """Per-env refusals and per-server admitted sessions (see the module docstring)."""

    def __init__(self, config: TransportConfig):
        self._config = config
        self._refused: dict[int, _Refusals] = {}
        self._sessions: dict[str, set[int]] = {}  # per server: envs whose current session it admitted
        self._peak: dict[str, int] = {}
        self._told: set[str] = set()

    @property
    def peak(self) -> dict[str, int]:
        """Per server URL, the most sessions it had admitted at once."""
        return dict(self._peak)

    @property
    def waiting(self) -> bool:
        """Whether any env waits to ask again."""
        return bool(self._refused)

    def retry_at(self, env_id: int) -> float | None:
        """``time.monotonic()`` after which env ``env_id`` may ask again; None when it is not waiting."""
        refusals = self._refused.get(env_id)
        return None if refusals is None else refusals.retry_at

    def may_ask(self, env_id: int, now: float) -> bool:
        """Whether env ``env_id`` may send a request at ``now``."""
        refusals = self._refused.get(env_id)
        return refusals is None or refusals.retry_at <= now

    def admitted(self, env_id: int, url: str) -> None:
        """A reply came for env ``env_id``'s session from ``url``: it is admitted there."""
        self._refused.pop(env_id, None)
        sessions = self._sessions.setdefault(url, set())
        sessions.add(env_id)
        self._peak[url] = max(self._peak.get(url, 0), len(sessions))

    def ended(self, env_id: int) -> None:
        """Env ``env_id``'s episode ended: its session no longer holds a place (its refusals are kept)."""
        for sessions in self._sessions.values():
            sessions.discard(env_id)

    def refused(self, env_id: int, url: str, error: SessionRefused, now: float | None = None) -> DzGymError:
        """``url`` refused env ``env_id``'s session: schedule its next try and return the error to report,
        a final one naming the wait once ``admission_wait`` is spent (the env then no longer waits)."""
        now = time.monotonic() if now is None else now
        refusals = self._refused.setdefault(env_id, _Refusals(first_at=now))
        refusals.count += 1
        waited = now - refusals.first_at
        delay = self._config.admission_delay(refusals.count, waited)
        if url not in self._told:
            self._told.add(url)
            text = error.message.strip().splitlines()
            logger.warning(
                "server %s refused a new session with %d of this run's sessions admitted there (%s); the envs it "
                "refuses wait and ask again, each for at most %g s",
                url,
                len(self._sessions.get(url, ())),
                text[-1] if text else error,
                self._config.admission_wait,
            )
        if delay is None:
            del self._refused[env_id]
            return SessionRefused(
                f"{error.message} (still refused after {refusals.count} tries in {waited:.0f} s; "
                f"admission_wait={self._config.admission_wait:g} s)",
                fatal=error.fatal,
                code=error.code,
            )
        refusals.retry_at = now + delay
        return error
