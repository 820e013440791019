"""The attempts of a scene's episodes that ended by an infrastructure error and run again (no I/O of its own).

An attempt that a server error, a lost connection or a timeout ended leaves no row: it is logged in the run
directory's ``attempts.jsonl`` (through the :class:`~dz_gym.eval.rundir.RunDir` the caller passes) and its
episode runs again from its reset, at most ``episode_retries`` times. :class:`Attempts` holds, per
``(episode, arm)``, the events of the attempts run again (read back on resume, so a resumed run counts the
retries it already spent and its rows say them) and the request delays the last of them drew (a latency-honest
rerun replays them instead of drawing new ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["Attempts"]

Key = tuple[int, "str | None"]


class Attempts:
    """See the module docstring: ``records`` are ``attempts.jsonl``'s, of which those of ``scene`` and of an
    ``(episode, arm)`` in ``todo`` count; ``append`` writes one more record."""

    def __init__(self, records: Iterable[Mapping[str, Any]], scene: int, todo: Iterable[Key], episode_retries: int,
                 append: Callable[[Mapping[str, Any]], None]):  # fmt: skip
        self.episode_retries = int(episode_retries)
        self._append = append
        self._events: dict[Key, list[str]] = {}  # (episode, arm) -> the events of its attempts run again
        self._delays: dict[Key, list[int]] = {}  # (episode, arm) -> the request delays its last retried attempt drew
        todo = set(todo)
        for record in records:
            if record.get("scene") == scene and (record.get("episode"), record.get("arm")) in todo:
                key = (int(record["episode"]), record.get("arm"))
                self._events.setdefault(key, []).append(str(record.get("error_event")))
                if isinstance(record.get("request_delays"), list):
                    self._delays[key] = [int(d) for d in record["request_delays"]]

    def events(self, episode: int, arm: str | None) -> list[str]:
        """The events of the episode's attempts run again, in order (its row's ``retried_events``)."""
        return list(self._events.get((episode, arm), []))

    def delays(self, episode: int, arm: str | None) -> list[int] | None:
        """The request delays the episode's last retried attempt drew (None: none recorded)."""
        return self._delays.get((episode, arm))

    def retry(self, *, scene: int, episode: int, arm: str | None, seed: int, steps: int, error_event: str | None,
              error: str, started_at: str, delays: Sequence[int]) -> int | None:  # fmt: skip
        """Log one more attempt of the episode (its fields, and the request ``delays`` it drew) and return its
        number, or None when the episode's retries are used up (nothing is logged)."""
        events = self._events.setdefault((episode, arm), [])
        if len(events) >= self.episode_retries:
            return None
        events.append(str(error_event))
        drawn = self._delays[(episode, arm)] = [int(d) for d in delays]
        self._append({"scene": scene, "episode": episode, "arm": arm, "seed": seed, "attempt": len(events),
                      "steps": steps, "error_event": error_event, "error": error, "started_at": started_at,
                      "request_delays": list(drawn)})  # fmt: skip
        return len(events)
