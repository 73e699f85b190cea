"""A client for a vLLM OpenAI-compatible server: /health, /v1/models, /metrics and streamed
/v1/completions with the prompt given as token ids (so both engines see exactly the same tokens).

Every failure ends as one sentence naming the cause (`VllmError`): not reachable, not healthy yet,
a model name the server does not serve, a request it refused (e.g. longer than its max-model-len), or a
server that stopped answering mid-stream. Standard library only (urllib), no vLLM import.
"""
from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlparse

from specviz.lessons import Said, quoted
from specviz.limits import LimitError


class VllmError(LimitError):
    """A vLLM server could not serve a request; the message is one sentence for a human."""


@dataclass(frozen=True)
class ServedModel:
    name: str                   # what the operator called it (--served-model-name): read, never assumed
    max_len: int | None         # max-model-len: prompt + new tokens must fit
    root: str                   # where it was loaded from (a directory or hub id)


@dataclass
class Chunk:
    """One streamed piece of one completion: usually one engine step's tokens."""

    token_ids: list[int]
    text: str = ""
    finish: str | None = None                  # "length" | "stop" | None
    spec: dict | None = None                   # metrics.speculative_decoding (final chunk only)
    prompt_ids: list[int] | None = None        # echoed once, with return_token_ids


@dataclass
class Completion:
    """A whole streamed completion, folded (what `complete()` returns)."""

    token_ids: list[int] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)    # token ids per streamed chunk
    finish: str | None = None
    spec: dict | None = None


def normalise_url(url: str) -> str:
    u = urlparse((url or "").strip())
    if u.scheme not in ("http", "https") or not u.hostname:
        raise VllmError(Said("errors.vllm.bad_url", url=quoted(url)))
    return f"{u.scheme}://{u.netloc}"


class VllmClient:
    def __init__(self, url: str, timeout_s: float = 30.0):
        self.url = normalise_url(url)
        self.timeout_s = timeout_s

    # --- plain GETs ------------------------------------------------------------------------------------
    def _get(self, path: str, timeout: float | None = None) -> bytes:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout or self.timeout_s) as r:
                return r.read()
        except urllib.error.HTTPError as exc:
            raise VllmError(Said("errors.vllm.http", url=self.url, path=path, code=exc.code)) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, http.client.HTTPException, OSError) as exc:
            raise VllmError(Said("errors.vllm.unreachable", url=self.url, reason=_reason(exc))) from None

    def healthy(self) -> bool:
        try:
            self._get("/health", timeout=5)
            return True
        except VllmError:
            return False

    def models(self) -> list[ServedModel]:
        raw = self._get("/v1/models")          # its VllmError (a ValueError) must not be caught below
        try:
            data = json.loads(raw)["data"]
        except (ValueError, KeyError, TypeError):
            raise VllmError(Said("errors.vllm.not_vllm", url=self.url)) from None
        return [ServedModel(str(m["id"]), m.get("max_model_len"), str(m.get("root") or m["id"])) for m in data]

    def model(self, name: str | None = None) -> ServedModel:
        """The served model called `name` (the only one, when None)."""
        served = self.models()
        if not served:
            raise VllmError(Said("errors.vllm.no_model", url=self.url))
        if name is None:
            return served[0]
        for m in served:
            if m.name == name:
                return m
        names = ", ".join(m.name for m in served)
        raise VllmError(Said("errors.vllm.other_model", url=self.url, name=quoted(name), names=names))

    def metrics_text(self) -> str:
        return self._get("/metrics", timeout=5).decode("utf-8", "replace")

    # --- a streamed completion ---------------------------------------------------------------------------
    def stream(self, model: str, prompt_ids: list[int], max_tokens: int, temperature: float = 0.0,
               ignore_eos: bool = False, seed: int | None = None) -> Iterator[Chunk]:
        """Yield the completion's chunks as the server sends them; the last carries `spec` (the
        per-request speculative-decoding metrics) when the server was started with them."""
        body = {"model": model, "prompt": [int(t) for t in prompt_ids], "max_tokens": int(max_tokens),
                "temperature": float(temperature), "stream": True, "return_token_ids": True,
                "ignore_eos": bool(ignore_eos), "stream_options": {"include_usage": True}}
        if seed is not None and temperature > 0:
            body["seed"] = int(seed)
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise VllmError(refusal(exc.code, _read_error(exc), self.url)) from None
        except (urllib.error.URLError, ConnectionError, socket.timeout, http.client.HTTPException, OSError) as exc:
            raise VllmError(Said("errors.vllm.unreachable", url=self.url, reason=_reason(exc))) from None
        with resp:
            yield from self._events(resp)

    def _events(self, resp) -> Iterator[Chunk]:
        done = False
        try:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = parse_chunk(json.loads(data), self.url)
                if chunk is not None:
                    yield chunk
        except VllmError:
            raise
        except (ConnectionError, socket.timeout, http.client.HTTPException, OSError, ValueError) as exc:
            raise VllmError(Said("errors.vllm.stopped_answering", url=self.url, reason=_reason(exc))) from None
        if not done:
            raise VllmError(Said("errors.vllm.stream_closed", url=self.url))

    def complete(self, model: str, prompt_ids: list[int], max_tokens: int, **kw) -> Completion:
        out = Completion()
        for ch in self.stream(model, prompt_ids, max_tokens, **kw):
            if ch.token_ids:
                out.token_ids += ch.token_ids
                out.chunks.append(list(ch.token_ids))
            out.finish = ch.finish or out.finish
            out.spec = ch.spec or out.spec
        return out


def parse_chunk(obj: dict, url: str = "the vLLM server") -> Chunk | None:
    """One `data:` object of the stream → a Chunk (None for an empty one). An error object mid-stream
    (vLLM sends one when generation fails) becomes a VllmError."""
    if "error" in obj and not obj.get("choices"):
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else str(err)
        raise VllmError(Said("errors.vllm.failed", url=url, detail=_first_line(msg)))
    spec = ((obj.get("metrics") or {}).get("speculative_decoding")) or None
    choices = obj.get("choices") or []
    if not choices:
        return Chunk([], spec=spec) if spec else None
    c = choices[0]
    return Chunk([int(t) for t in (c.get("token_ids") or [])], c.get("text") or "", c.get("finish_reason"),
                 spec, c.get("prompt_token_ids"))


def refusal(code: int, message: str, url: str) -> Said:
    """vLLM's HTTP error → one sentence naming the cause (vLLM's own words quoted as its detail)."""
    low = message.lower()
    if code == 404 and "model" in low:
        return Said("errors.vllm.refused_model", url=url, detail=_first_line(message))
    if "maximum context length" in low or "max_model_len" in low or "too long" in low or "context length" in low:
        return Said("errors.vllm.refused_long", detail=_first_line(message))
    return Said("errors.vllm.refused", code=code, detail=_first_line(message))


def _read_error(exc: urllib.error.HTTPError) -> str:
    try:
        obj = json.loads(exc.read().decode("utf-8", "replace"))
        err = obj.get("error", obj)
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except Exception:
        return exc.reason if isinstance(exc.reason, str) else f"HTTP {exc.code}"


def _first_line(text: str, limit: int = 240) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line[:limit]


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    if isinstance(inner, BaseException):
        exc = inner
    text = str(exc).strip() or type(exc).__name__
    return _first_line(text, 120)
