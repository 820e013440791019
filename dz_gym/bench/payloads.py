"""Realistic infer requests for load tests, encoded once so the client's own cost stays small.

A :class:`PayloadSet` holds a few pre-encoded requests (*templates*): three camera views at the server's
``image_resolution``, joint and gripper positions, the prompt, ``endpoint: "infer"``. Only the session id
changes from one request to the next, so each template is stored as the msgpack bytes before and after the
session id value and a request is ``prefix + packb(session_id) + suffix``: one copy of ~0.5 MB instead of a
full encode. (A msgpack string carries its own length, so any session id fits.)

Image content is either synthetic (smooth colour fields, a few blocks and noise: it looks like a camera frame
to a model and costs the same bytes on the wire) or read from a directory (``png``/``jpg`` frames or ``mp4``
videos, walked in name order). A frame that is three views side by side (the evaluator's videos are
``right external | wrist | left external`` strips) is split in three; a single view is used for all three
cameras. Frames are resized with padding to the server's resolution, as the evaluator does. The requests
follow the server's profile (:mod:`dz_gym.protocol.profiles`): its keys, its views or composite.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dz_gym.envs import droid
from dz_gym.protocol import build_infer_request, packb
from dz_gym.protocol.composite import composite_of
from dz_gym.protocol.profiles import PROFILES, ServerProfile

__all__ = [
    "DEFAULT_RESOLUTION",
    "FRAME_SUFFIXES",
    "PayloadSet",
    "VIDEO_SUFFIXES",
    "load_views",
    "profile_images",
    "new_session_id",
    "split_views",
    "synthetic_views",
]

DEFAULT_RESOLUTION = droid.DEFAULT_EMBEDDED_IMAGE_SHAPE  # (180, 320), DreamZero's image_resolution
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg")
VIDEO_SUFFIXES = (".mp4",)
_PLACEHOLDER = "00000000-0000-4000-8000-000000000000"


def new_session_id() -> str:
    """A fresh episode id (uuid4, as the reference client uses)."""
    return str(uuid.uuid4())


def synthetic_views(count: int, resolution: tuple[int, int], seed: int = 0) -> list[tuple[np.ndarray, ...]]:
    """``count`` view triples ``(external, external_2, wrist)`` of uint8 ``(H, W, 3)``, deterministic in ``seed``."""
    height, width = resolution
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    triples = []
    for _ in range(count):
        views = []
        for _ in range(3):
            base = rng.uniform(40, 200, size=3).astype(np.float32)
            slope = rng.uniform(-0.4, 0.4, size=(2, 3)).astype(np.float32)
            image = base + yy[..., None] * slope[0] * 180 / height + xx[..., None] * slope[1] * 320 / width
            for _ in range(4):
                h0, w0 = rng.integers(0, height), rng.integers(0, width)
                h1, w1 = (
                    h0 + rng.integers(height // 10, height // 3 + 2),
                    w0 + rng.integers(width // 10, width // 3 + 2),
                )
                image[h0:h1, w0:w1] = rng.uniform(0, 255, size=3)
            image += rng.normal(0, 6, size=image.shape).astype(np.float32)
            views.append(np.clip(image, 0, 255).astype(np.uint8))
        triples.append(tuple(views))
    return triples


def split_views(frame: np.ndarray, resolution: tuple[int, int], layout: str = "auto") -> tuple[np.ndarray, ...]:
    """One frame -> ``(external, external_2, wrist)`` views (not yet resized).

    ``layout``: ``"strip"`` splits the width in three as ``external | wrist | external_2`` (the evaluator's
    video layout), ``"single"`` uses the frame for all three views, ``"auto"`` splits when a third of the
    frame is closer to the target aspect ratio than the whole frame is.
    """
    frame = np.asarray(frame)
    if frame.ndim == 2:
        frame = np.repeat(frame[..., None], 3, axis=2)
    if frame.ndim != 3 or frame.shape[2] not in (3, 4):
        raise ValueError(f"image frame: expected (H, W, 3) pixels, got shape {frame.shape}")
    frame = frame[..., :3]
    if frame.dtype != np.uint8:
        raise ValueError(f"image frame: expected uint8 pixels, got dtype {frame.dtype}")
    if layout not in ("auto", "strip", "single"):
        raise ValueError(f"layout: expected 'auto', 'strip' or 'single', got {layout!r}")
    height, width = frame.shape[:2]
    if layout == "auto":
        target = resolution[1] / resolution[0]
        whole = abs(np.log((width / height) / target))
        third = abs(np.log((width / 3 / height) / target))
        layout = "strip" if width >= 3 and third < whole else "single"
    if layout == "single":
        return (frame, frame, frame)
    if width < 3:
        raise ValueError(f"image frame: a strip of three views needs a width >= 3, got {width}")
    third = width // 3
    strip = {camera: frame[:, k * third : (k + 1) * third] for k, camera in enumerate(droid.VIDEO_STRIP_KEYS)}
    return tuple(strip[camera] for camera in droid.CAMERA_KEYS)


def _resize(view: np.ndarray, resolution: tuple[int, int]) -> np.ndarray:
    from dz_gym.preprocess import resize_with_pad

    return np.ascontiguousarray(resize_with_pad(np.ascontiguousarray(view), resolution[0], resolution[1]))


def _read_frames(path: Path, limit: int) -> list[np.ndarray]:
    import imageio.v3 as iio

    try:
        if path.suffix.lower() in FRAME_SUFFIXES:
            return [np.asarray(iio.imread(path))]
        frames = []
        for frame in iio.imiter(path):
            frames.append(np.asarray(frame))
            if len(frames) >= limit:
                break
        return frames
    except Exception as exc:  # imageio raises many kinds; the user needs the file and the reason
        raise ValueError(f"--images: cannot read {path.name}: {type(exc).__name__}: {exc}") from None


def load_views(
    directory: str | Path, resolution: tuple[int, int], *, max_frames: int = 32, layout: str = "auto"
) -> list[tuple[np.ndarray, ...]]:
    """View triples from the image and video files of ``directory``, resized to ``resolution``.

    Files are taken in name order (``png``/``jpg``/``jpeg`` frames, ``mp4`` videos); at most ``max_frames``
    triples are kept, spread evenly over everything read. Raises ``ValueError`` (one line) for a missing or
    empty directory or an unreadable file.
    """
    root = Path(directory)
    if not root.is_dir():
        raise ValueError(f"--images: expected a directory of png/jpg frames or mp4 videos, got {str(directory)!r}")
    files = sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in FRAME_SUFFIXES + VIDEO_SUFFIXES)
    if not files:
        raise ValueError(f"--images: no .png, .jpg or .mp4 files in {str(directory)!r}")
    frames: list[np.ndarray] = []
    per_video = max(max_frames * 4, 64)
    for path in files:
        frames.extend(_read_frames(path, per_video))
    if not frames:
        raise ValueError(f"--images: no frames could be read from {str(directory)!r}")
    picks = np.unique(np.linspace(0, len(frames) - 1, num=min(max_frames, len(frames))).round().astype(int))
    triples = []
    for index in picks:
        views = split_views(frames[index], resolution, layout)
        triples.append(tuple(_resize(view, resolution) for view in views))
    return triples


def profile_images(profile: ServerProfile, triple: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    """One ``(external, external_2, wrist)`` view triple as ``profile``'s request images: its view keys, or
    one composite (:mod:`dz_gym.protocol.composite`)."""
    views = dict(zip(droid.CAMERA_KEYS, triple))
    if profile.composite:
        return {profile.composite_key: composite_of(views)}
    return {key: views[camera] for camera, key in profile.image_keys}


class PayloadSet:
    """Pre-encoded infer requests of a server ``profile`` (default DreamZero's) that differ only in their
    session id.

    ``payload(k, session_id)`` returns the bytes of template ``k % len(self)`` with ``session_id`` in it.
    Joint positions vary slightly between templates around the DROID home pose.
    """

    def __init__(
        self,
        views: Sequence[tuple[np.ndarray, ...]],
        *,
        prompt: str = droid.SCENES[1].prompt,
        seed: int = 0,
        profile: ServerProfile | None = None,
    ):
        profile = PROFILES["dreamzero"] if profile is None else profile
        if profile.session_key is None:
            raise ValueError(f"profile: {profile.name} takes no session id, which the payload templates vary")
        if not views:
            raise ValueError("views: expected at least one (external, external_2, wrist) triple")
        rng = np.random.default_rng(seed)
        home = np.asarray(droid.HOME_JOINT_POSITIONS, dtype=np.float64)
        self._parts: list[tuple[bytes, bytes]] = []
        self._sizes: list[int] = []
        marker = packb(_PLACEHOLDER)
        for triple in views:
            if len(triple) != 3:
                raise ValueError(f"views: expected triples of three views, got {len(triple)}")
            request = build_infer_request(
                images=profile_images(profile, triple),
                joint_position=home + rng.normal(0, 0.05, size=droid.ARM_DOF),
                gripper_position=np.array([float(rng.uniform(0, 1) > 0.8)]),
                prompt=prompt,
                session_id=_PLACEHOLDER,
                profile=profile,
            )
            encoded = packb(request)
            # The session id is encoded after the images, so the last occurrence of the marker is the field.
            at = encoded.rfind(marker)
            if at < 0 or encoded.find(profile.session_key.encode()) < 0:
                raise RuntimeError("payload template: the encoded request has no session_id field")
            self._parts.append((encoded[:at], encoded[at + len(marker) :]))
            self._sizes.append(len(encoded) - len(marker))
        self.prompt = prompt
        self.resolution = tuple(int(s) for s in views[0][0].shape[:2])

    def __len__(self) -> int:
        return len(self._parts)

    def payload(self, index: int, session_id: str) -> bytes:
        """The encoded request of template ``index`` (modulo the count) under ``session_id``."""
        prefix, suffix = self._parts[index % len(self._parts)]
        return b"".join((prefix, packb(session_id), suffix))

    def size(self, index: int, session_id: str = _PLACEHOLDER) -> int:
        """Encoded size in bytes of ``payload(index, session_id)`` without building it."""
        return self._sizes[index % len(self._sizes)] + len(packb(session_id))
