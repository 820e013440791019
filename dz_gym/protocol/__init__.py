"""The OpenPI/DreamZero websocket protocol without I/O: the msgpack-numpy codec and the message helpers.

``codec`` turns Python/numpy values into frames and back (openpi markers out; openpi and legacy vLLM-Omni
markers in); ``messages`` builds requests and parses handshake, infer and reset replies for clients, and
decodes requests and encodes replies for servers; ``contract`` reads the robot policy contract a handshake
announces (horizon, action width and keys, session cap) and checks a client against it.
"""

from dz_gym.protocol.codec import DEFAULT_MAX_DEPTH, SUPPORTED_DTYPE_KINDS, packb, unpackb
from dz_gym.protocol.contract import PolicyContract, check_contract, policy_contract
from dz_gym.protocol.messages import (
    CARTESIAN_KEY,
    DREAMZERO_METADATA,
    GRIPPER_KEY,
    JOINT_KEY,
    MAX_VLLM_PAYLOAD_BYTES,
    RESET_SUCCESSFUL,
    InferReply,
    InvalidRequest,
    ServerMetadata,
    build_infer_request,
    build_reset_request,
    encode_error,
    encode_metadata,
    encode_reply,
    encode_reset_reply,
    is_error_reply,
    parse_infer_response,
    parse_metadata,
    parse_request,
    parse_reset_response,
)

__all__ = [
    "CARTESIAN_KEY",
    "DEFAULT_MAX_DEPTH",
    "DREAMZERO_METADATA",
    "GRIPPER_KEY",
    "InferReply",
    "InvalidRequest",
    "JOINT_KEY",
    "MAX_VLLM_PAYLOAD_BYTES",
    "PolicyContract",
    "RESET_SUCCESSFUL",
    "SUPPORTED_DTYPE_KINDS",
    "ServerMetadata",
    "build_infer_request",
    "build_reset_request",
    "check_contract",
    "encode_error",
    "encode_metadata",
    "encode_reply",
    "encode_reset_reply",
    "is_error_reply",
    "packb",
    "parse_infer_response",
    "parse_metadata",
    "parse_request",
    "parse_reset_response",
    "policy_contract",
    "unpackb",
]
