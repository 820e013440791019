"""One batch step's infer requests as columns (pure, no I/O): :class:`RequestBatch`.

The requests of a batch step's due envs differ only in their rows: the same keys in the same order, views of
one shape, proprio of fixed size, and per env a prompt and a session id. Built one by one (a dict each, then
msgpack-packed each), the requests of N = 1024 envs were most of a request round's time in the calling thread
(benchmarks/journal/isaac3.md). A :class:`RequestBatch` keeps the columns instead:

- as a ``Mapping[int, dict]`` (env id -> the very dict :func:`~dz_gym.protocol.build_infer_request` builds,
  made when asked for), so any client takes it as before (what ``PolicyClient.submit_batch`` sends by
  default);
- through :meth:`RequestBatch.frame_template`, the msgpack frame of all its requests at once: one template
  (:func:`~dz_gym.protocol.packer.fast_template`) whose slots are the columns' rows and each request's two
  packed strings (the transport's pools' ``submit_batch``). A client that frames the requests elsewhere (the
  transport's worker processes) is handed the template once and per request its row and strings; :func:`frame_of`
  joins one frame, the bytes of ``packb(batch[env_id])`` exactly.

Everything :func:`build_infer_request` checks is checked when the batch is made, with its messages: the first
request is built (the keys, the views' dtype and shape, the vectors' sizes), every row's proprio must be
finite and every prompt and session id a string (the first failing env's request is then built, which raises
the error it would have raised).

Every server profile (:mod:`dz_gym.protocol.profiles`) frames this way: its view keys (or one composite
column, composed here once for the batch), its proprio columns (joints and gripper, or one state) and strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from dz_gym.protocol.composite import compose_views
from dz_gym.protocol.messages import DEFAULT_PROFILE, build_infer_request
from dz_gym.protocol.packer import fast_template, join_template, str_bytes
from dz_gym.protocol.profiles import ServerProfile

__all__ = ["FrameTemplate", "RequestBatch", "frame_of"]


@dataclasses.dataclass(frozen=True)
class FrameTemplate:
    """The frame of every request of a batch: ``parts`` (bytes, and slot numbers); slot ``s <
    len(columns)`` is row ``r`` of ``columns[s]`` (a C-contiguous array whose first axis is the batch's rows,
    sent as its raw bytes), slot ``len(columns) + j`` the request's ``j``-th packed string (its prompt, then
    its session id; :meth:`RequestBatch.strings`). ``fixed_bytes``: the parts' own bytes."""

    parts: list[bytes | int]
    columns: list[np.ndarray]
    fixed_bytes: int

    def row_bytes(self, column: int) -> int:
        """The bytes of one row of ``columns[column]``."""
        array = self.columns[column]
        return array.nbytes // array.shape[0]


def frame_of(parts: list, rows: Sequence[Any], strings: Sequence[bytes]) -> bytes:
    """A request's frame from a template's ``parts``: ``rows`` holds its row of each column (bytes-like),
    ``strings`` its packed strings."""
    return join_template(parts, [*rows, *strings])


class RequestBatch(Mapping):
    """The infer requests of ``env_ids`` (see the module docstring): ``views`` maps each camera to its rows
    (in sorted env-id order, as :func:`dz_gym.requests.resized_views` returns them), ``joints``/``gripper``
    are every env's proprio (indexed by env id), ``prompts``/``session_ids`` every env's strings (indexed
    by env id), ``image_keys`` each camera's request key, ``profile`` the server's (default DreamZero's; a
    composite profile gets the three views composed into one column). Raises
    :class:`~dz_gym.protocol.InvalidRequest` as :func:`~dz_gym.protocol.build_infer_request` would for the
    first bad request."""

    def __init__(
        self,
        views: Mapping[str, np.ndarray],
        joints: np.ndarray,
        gripper: np.ndarray,
        env_ids: Sequence[int],
        *,
        prompts: Sequence[str],
        session_ids: Sequence[str | None],
        image_keys: Mapping[str, str],
        profile: ServerProfile | None = None,
    ):
        self.profile = DEFAULT_PROFILE if profile is None else profile
        self.env_ids = sorted(int(i) for i in env_ids)
        self._row = {env_id: row for row, env_id in enumerate(self.env_ids)}
        self._views = {image_keys[camera]: views[camera] for camera in image_keys}
        if self.profile.composite and self.env_ids:
            left, right, wrist = (self._views[key] for _, key in self.profile.image_keys)
            self._views = {self.profile.composite_key: compose_views(wrist, left, right)}
        self._joints, self._gripper = joints, gripper
        self._prompts, self._session_ids = prompts, session_ids
        self._template: FrameTemplate | None | bool = False  # False: not made yet
        if not self.env_ids:
            return
        self.request(self.env_ids[0])  # the keys, the views' dtype and shape, the vectors' sizes
        ids = np.asarray(self.env_ids)
        finite = np.isfinite(np.asarray(joints, dtype=np.float64)[ids]).all(axis=1)
        finite &= np.isfinite(np.asarray(gripper, dtype=np.float64)[ids]).all(axis=1)
        for row, env_id in enumerate(self.env_ids):
            session_id = session_ids[env_id]
            if (
                not finite[row]
                or type(prompts[env_id]) is not str
                or (session_id is not None and (type(session_id) is not str or not session_id))
            ):
                self.request(env_id)  # raises as build_infer_request does for it

    # -- the Mapping: env id -> its request dict ----------------------------------------------------------
    def __getitem__(self, env_id: int) -> dict:
        if env_id not in self._row:
            raise KeyError(env_id)
        return self.request(env_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self.env_ids)

    def __len__(self) -> int:
        return len(self.env_ids)

    def request(self, env_id: int) -> dict:
        """Env ``env_id``'s request dict, built now (a new dict at every call; the views are not copied)."""
        row = self._row[env_id]
        return build_infer_request(
            images={key: column[row] for key, column in self._views.items()},
            joint_position=self._joints[env_id],
            gripper_position=self._gripper[env_id],
            prompt=self._prompts[env_id],
            session_id=self._session_ids[env_id],
            profile=self.profile,
        )

    def array_bytes(self) -> int:
        """The bytes of every request's arrays (the views and proprio), without building the requests."""
        views = sum(int(column.nbytes) for column in self._views.values())
        values = 8 + (6 if self.profile.cartesian_key is not None else 0)  # joints 7, gripper 1 (cartesian 6)
        return views + len(self.env_ids) * values * np.dtype(self.profile.proprio_dtype).itemsize

    # -- the frames, once for all its requests ------------------------------------------------------------
    def row(self, env_id: int) -> int:
        """Env ``env_id``'s row in the columns."""
        return self._row[env_id]

    def frame_template(self) -> FrameTemplate | None:
        """The frame template of every request (see :class:`FrameTemplate`), made at the first call; None
        where the requests do not share one (a session id of None leaves its key out, some value is one the
        fast packer leaves to msgpack's general path) or a view's rows are not C-contiguous."""
        if self._template is False:
            self._template = self._make_template()
        return self._template

    def _make_template(self) -> FrameTemplate | None:
        profile = self.profile
        if not self.env_ids or any(self._session_ids[i] is None for i in self.env_ids):
            return None
        ids = np.asarray(self.env_ids)
        dtype = np.dtype(profile.proprio_dtype)
        joints = np.asarray(self._joints, dtype=np.float64)[ids]
        gripper = np.asarray(self._gripper, dtype=np.float64)[ids]
        proprio = [np.concatenate([joints, gripper], axis=1)] if profile.state_key is not None else [joints, gripper]
        columns = [*self._views.values(), *(np.ascontiguousarray(p, dtype=dtype) for p in proprio)]
        if any(type(c) is not np.ndarray or not c.flags.c_contiguous or c.shape[0] != len(ids) for c in columns):
            return None
        strings = [profile.prompt_key] + ([profile.session_key] if profile.session_key is not None else [])
        keys = [*self._views, *profile.proprio_keys, *strings]
        parts = fast_template(self.request(self.env_ids[0]), {key: slot for slot, key in enumerate(keys)})
        if parts is None:
            return None
        fixed = sum(len(part) for part in parts if type(part) is bytes)
        return FrameTemplate(parts, columns, fixed)

    def strings(self, env_id: int) -> list[bytes] | None:
        """Env ``env_id``'s packed prompt and session id (the template's last two slots); None for text that
        is not UTF-8 (the general path then words the error)."""
        session_id = self._session_ids[env_id]
        packed = [str_bytes(self._prompts[env_id])]
        if self.profile.session_key is not None:
            packed.append(None if session_id is None else str_bytes(session_id))
        return None if None in packed else packed

    def frame(self, env_id: int) -> bytes | None:
        """Env ``env_id``'s frame from the template (the bytes of ``packb(self[env_id])``); None without one."""
        template = self.frame_template()
        strings = None if template is None else self.strings(env_id)
        if strings is None:
            return None
        row = self._row[env_id]
        return frame_of(template.parts, [column[row] for column in template.columns], strings)
