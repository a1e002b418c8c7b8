"""FusedServeClient: numpy arrays in and out of a fusedserve server over gRPC.

    from fusedserve_client import FusedServeClient
    with FusedServeClient("localhost:50051") as c:
        c.wait_until_serving()
        y = c.fused_op("rms_norm", x=x, weight=w, eps=1e-5)["y"]
        for piece in (stream := c.generate("The capital of France is", max_new_tokens=8)):
            print(piece, end="", flush=True)
        print(stream.stats)
        reply = c.chat([{"role": "user", "content": "Hi!"}], max_new_tokens=32).collect()
        ids = c.tokenize("Hello").token_ids

Every RPC error is raised as FusedServeError with the gRPC status code and the
server's message (which names the offending field for INVALID_ARGUMENT).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import grpc
import numpy as np

from . import _health
from ._stubs import pb, pb_grpc
from .tensors import DTypeLike, from_tensor, to_tensor, wire_dtype_name

# Attributes the op table declares as floating point: an int written for them
# (theta=500000) is sent as a double, as the server expects.
_FLOAT_ATTRS = frozenset({"eps", "theta", "scale"})

# Unary calls get this deadline unless the caller passes timeout=...
DEFAULT_TIMEOUT_S = 60.0
# gRPC's default 4 MiB receive limit is too small for real activations.
MAX_MESSAGE_BYTES = 1 << 30

_UNSET: Any = object()


class FusedServeError(Exception):
    """A failed RPC: .code is the grpc.StatusCode, .details the server's message."""

    def __init__(self, rpc: str, code: grpc.StatusCode, details: str):
        self.rpc = rpc
        self.code = code
        self.details = details or ""
        super().__init__(f"{rpc} failed: {code.name}: {self.details}")

    @classmethod
    def from_rpc_error(cls, rpc: str, err: grpc.RpcError) -> "FusedServeError":
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(rpc, code or grpc.StatusCode.UNKNOWN, details or "")


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_seconds: float
    time_per_output_token_seconds: float
    finish_reason: str  # "length", "stop", "eos" or "unspecified"

    @classmethod
    def from_proto(cls, s: "pb.GenerationStats") -> "GenerationStats":
        reason = pb.FinishReason.Name(s.finish_reason).removeprefix("FINISH_REASON_").lower() \
            if s.finish_reason in pb.FinishReason.values() else str(s.finish_reason)
        return cls(s.prompt_tokens, s.generated_tokens, s.time_to_first_token_seconds,
                   s.time_per_output_token_seconds, reason)


@dataclass(frozen=True)
class Tokenized:
    token_ids: List[int]
    tokens: List[str]  # each token's text (bytes shown lossily as UTF-8)


class GenerateStream(Iterator[Any]):
    """A Generate stream. Iterating yields text pieces for a text prompt
    (generate("...") or chat(...)), token ids for a token-id prompt; either
    way .tokens, .text (the text so far, when the server has a tokenizer) and
    .logprobs (PositionLogprobs messages, with logprobs=True) accumulate, and
    .stats is set once the stream has ended.

    Leaving a `with` block (or calling cancel()) before the end cancels the RPC,
    which frees the sequence's KV cache on the server at its next step.
    """

    def __init__(self, call, text_mode: bool = False):
        self._call = call
        self._text_mode = text_mode
        self._pending: List[Any] = []
        self._done = False
        self.tokens: List[int] = []
        self.text: str = ""
        self.logprobs: List["pb.PositionLogprobs"] = []
        self.stats: Optional[GenerationStats] = None

    def __iter__(self) -> "GenerateStream":
        return self

    def __next__(self) -> Any:
        while not self._pending:
            if self._done:
                raise StopIteration
            try:
                msg = next(self._call)
            except StopIteration:
                self._done = True
                raise
            except grpc.RpcError as e:
                self._done = True
                raise FusedServeError.from_rpc_error("Generate", e) from None
            self.tokens.extend(msg.token_ids)
            self.text += msg.text
            self.logprobs.extend(msg.logprobs)
            if self._text_mode:
                if msg.text:
                    self._pending.append(msg.text)
            else:
                self._pending.extend(msg.token_ids)
            if msg.HasField("stats"):
                self.stats = GenerationStats.from_proto(msg.stats)
        return self._pending.pop(0)

    def collect(self) -> Any:
        """Reads the stream to its end; returns the whole text (text prompt)
        or every token id (token-id prompt)."""
        for _ in self:
            pass
        return self.text if self._text_mode else list(self.tokens)

    def cancel(self) -> None:
        if not self._done:
            self._call.cancel()
            self._done = True

    def __enter__(self) -> "GenerateStream":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()


Message = Union[Mapping[str, str], Tuple[str, str], "pb.ChatMessage"]


def _chat_messages(messages: Iterable[Message]) -> List["pb.ChatMessage"]:
    out = []
    for m in messages:
        if isinstance(m, pb.ChatMessage):
            out.append(m)
        elif isinstance(m, Mapping):
            out.append(pb.ChatMessage(role=str(m["role"]), content=str(m["content"])))
        else:
            role, content = m
            out.append(pb.ChatMessage(role=str(role), content=str(content)))
    return out


class FusedServeClient:
    """A client of one fusedserve server (one gRPC channel, thread-safe)."""

    def __init__(self, target: str = "localhost:50051", *,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 timeout: Optional[float] = DEFAULT_TIMEOUT_S,
                 options: Sequence = (),
                 channel: Optional[grpc.Channel] = None):
        """target: "host:port". credentials: grpc.ssl_channel_credentials(...) for TLS.
        timeout: default deadline in seconds of unary calls (None: no deadline).
        channel: use this channel instead of creating one (it is not closed by close())."""
        self.target = target
        self.timeout = timeout
        self._own_channel = channel is None
        if channel is None:
            opts = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), *options]
            channel = (grpc.secure_channel(target, credentials, options=opts) if credentials
                       else grpc.insecure_channel(target, options=opts))
        self.channel = channel
        self.stub = pb_grpc.FusedServeStub(channel)
        self._health_check = channel.unary_unary(
            _health.CHECK_METHOD, request_serializer=_health.encode_request,
            response_deserializer=_health.decode_response)

    # -- lifecycle --------------------------------------------------------------
    def close(self) -> None:
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> "FusedServeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _deadline(self, timeout):
        return self.timeout if timeout is _UNSET else timeout

    # -- FusedOp ----------------------------------------------------------------
    def fused_op(self, op: str, inputs: Optional[Mapping[str, Any]] = None,
                 attrs: Optional[Mapping[str, Any]] = None, *,
                 dtype: DTypeLike = None, timeout: Optional[float] = _UNSET,
                 metadata: Optional[Sequence] = None, **named: Any) -> Dict[str, np.ndarray]:
        """Runs one fused op and returns its outputs by name.

        Keyword arguments that are arrays (or lists) are inputs, scalars
        (float, int, str, bool) are attributes:
            fused_op("rms_norm", x=x, weight=w, eps=1e-5)            -> {"y": ...}
            fused_op("linear", x=x, weight=w, bias=b, activation="silu")
        inputs= and attrs= dicts do the same explicitly.
        dtype: wire dtype of the float inputs ("f32", "f16", "bf16"); default:
        each float array's own dtype (float64 is sent as f32). Outputs have the
        request's float dtype, bf16 returned as float32.
        """
        all_inputs: Dict[str, Any] = dict(inputs or {})
        all_attrs: Dict[str, Any] = dict(attrs or {})
        for key, value in named.items():
            if _is_attr(value):
                all_attrs[key] = value
            else:
                all_inputs[key] = value
        wire = wire_dtype_name(dtype)
        req = pb.FusedOpRequest(op=op)
        for key, value in all_inputs.items():
            req.inputs[key].CopyFrom(to_tensor(value, wire))
        for key, value in all_attrs.items():
            req.attrs[key].CopyFrom(_attr(key, value))
        try:
            resp = self.stub.FusedOp(req, timeout=self._deadline(timeout), metadata=metadata)
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("FusedOp", e) from None
        return {name: from_tensor(t, name) for name, t in resp.outputs.items()}

    # -- TransformerBlock ---------------------------------------------------------
    def transformer_block(self, hidden: Any, *, first_layer: int = 0, num_layers: int = 0,
                          positions: Any = None, dtype: DTypeLike = None,
                          timeout: Optional[float] = _UNSET) -> np.ndarray:
        """Runs layers [first_layer, first_layer+num_layers) of the hosted model over
        hidden [B, S, D]; num_layers=0 runs to the last layer."""
        req = pb.TransformerBlockRequest(hidden=to_tensor(hidden, wire_dtype_name(dtype)),
                                         first_layer=first_layer, num_layers=num_layers)
        if positions is not None:
            req.positions.CopyFrom(to_tensor(positions))
        try:
            resp = self.stub.TransformerBlock(req, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("TransformerBlock", e) from None
        return from_tensor(resp.hidden, "hidden")

    # -- Generate -----------------------------------------------------------------
    def generate(self, prompt: Union[str, Iterable[int], None] = None, max_new_tokens: int = 16, *,
                 prompt_token_ids: Optional[Iterable[int]] = None,
                 messages: Optional[Iterable[Message]] = None,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 0.0,
                 seed: int = 0, stop: Union[str, Iterable[str]] = (), stop_token_ids: Iterable[int] = (),
                 logprobs: bool = False, top_logprobs: int = 0,
                 skip_special_tokens: bool = True, add_special_tokens: bool = True,
                 ignore_eos: bool = False, timeout: Optional[float] = None) -> GenerateStream:
        """Streams a generation. prompt is text (a str: the stream yields text
        pieces, encoded with the server's tokenizer) or token ids (yields ids);
        or give messages (chat turns, see chat()). temperature 0 is greedy; the
        same seed and request give the same tokens. stop: strings that end the
        text (not returned); text prompts also end at the tokenizer's
        end-of-sequence tokens unless ignore_eos. logprobs / top_logprobs
        (0..20): each token's log-probability and the most likely alternatives
        (stream.logprobs). The stream's .stats (prompt and generated tokens,
        TTFT, TPOT, finish reason) is set after the last message.
        timeout: deadline of the whole stream in seconds (default: none)."""
        req = pb.GenerateRequest(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                                 top_k=int(top_k), top_p=float(top_p), seed=int(seed),
                                 stop_token_ids=[int(t) for t in stop_token_ids],
                                 stop=[stop] if isinstance(stop, str) else [str(x) for x in stop],
                                 logprobs=bool(logprobs), top_logprobs=int(top_logprobs),
                                 ignore_eos=bool(ignore_eos))
        if not skip_special_tokens:
            req.skip_special_tokens = False
        if not add_special_tokens:
            req.add_special_tokens = False
        text_mode = True
        if isinstance(prompt, str):
            req.prompt = prompt
        elif prompt is not None:
            req.prompt_token_ids.extend(int(t) for t in prompt)
            text_mode = False
        if prompt_token_ids is not None:
            req.prompt_token_ids.extend(int(t) for t in prompt_token_ids)
            text_mode = False
        if messages is not None:
            req.messages.extend(_chat_messages(messages))
            text_mode = True
        return GenerateStream(self.stub.Generate(req, timeout=timeout), text_mode=text_mode)

    def chat(self, messages: Iterable[Message], max_new_tokens: int = 256, **kw: Any) -> GenerateStream:
        """Streams the assistant's reply to chat turns ({"role": ..., "content":
        ...} dicts or (role, content) pairs) as text pieces, formatted with the
        checkpoint's chat format (server_info().tokenizer.chat_format). Takes
        generate()'s keyword arguments."""
        return self.generate(messages=messages, max_new_tokens=max_new_tokens, **kw)

    def tokenize(self, text: Optional[str] = None, *, messages: Optional[Iterable[Message]] = None,
                 add_special_tokens: bool = True, timeout: Optional[float] = _UNSET) -> Tokenized:
        """Text (or chat turns) -> token ids with the server's tokenizer, and each
        token's text. add_special_tokens: the tokenizer's BOS (text only)."""
        req = pb.TokenizeRequest()
        if text is not None:
            req.text = text
        if messages is not None:
            req.messages.extend(_chat_messages(messages))
        if not add_special_tokens:
            req.add_special_tokens = False
        try:
            resp = self.stub.Tokenize(req, timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("Tokenize", e) from None
        return Tokenized(list(resp.token_ids), list(resp.tokens))

    def detokenize(self, token_ids: Iterable[int], *, skip_special_tokens: bool = True,
                   timeout: Optional[float] = _UNSET) -> str:
        """Token ids -> text (special tokens left out unless skip_special_tokens=False)."""
        req = pb.DetokenizeRequest(token_ids=[int(t) for t in token_ids])
        if not skip_special_tokens:
            req.skip_special_tokens = False
        try:
            return self.stub.Detokenize(req, timeout=self._deadline(timeout)).text
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("Detokenize", e) from None

    # -- Info and health ----------------------------------------------------------
    def server_info(self, timeout: Optional[float] = _UNSET) -> "pb.GetServerInfoResponse":
        """Device, model shape, ops with their dtypes and tuning-cache state (the
        GetServerInfoResponse message: info.device, info.model.hidden_size, ...)."""
        try:
            return self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=self._deadline(timeout))
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("GetServerInfo", e) from None

    def health(self, service: str = "", timeout: Optional[float] = 5.0) -> str:
        """grpc.health.v1 status: "SERVING", "NOT_SERVING" (warming up or draining),
        "SERVICE_UNKNOWN" or "UNKNOWN"."""
        try:
            return self._health_check(service, timeout=timeout)
        except grpc.RpcError as e:
            raise FusedServeError.from_rpc_error("Health.Check", e) from None

    def wait_until_serving(self, timeout: float = 300.0, service: str = "",
                           poll_interval: float = 0.2) -> None:
        """Polls health until SERVING (the server warms up before serving).
        Raises TimeoutError with the last status or error seen."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            try:
                last = self.health(service, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                if last == "SERVING":
                    return
            except FusedServeError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.target} not SERVING after {timeout:.0f} s (last: {last})")
            time.sleep(poll_interval)


def _is_attr(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str, np.bool_, np.integer, np.floating)) \
        and not isinstance(value, np.ndarray)


def _attr(key: str, value: Any) -> "pb.AttrValue":
    if isinstance(value, (bool, np.bool_)):
        return pb.AttrValue(b=bool(value))
    if isinstance(value, (int, np.integer)):
        return pb.AttrValue(f=float(value)) if key in _FLOAT_ATTRS else pb.AttrValue(i=int(value))
    if isinstance(value, (float, np.floating)):
        return pb.AttrValue(f=float(value))
    if isinstance(value, str):
        return pb.AttrValue(s=value)
    raise TypeError(f"attribute {key!r}: unsupported type {type(value).__name__} (float, int, str or bool)")
