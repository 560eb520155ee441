"""aiohttp routes for one simulated pool (serving.py serves several in one event loop).

Surface per pool port: OpenAI-compatible `/v1/models`, `/v1/chat/completions`,
`/v1/completions`, `/v1/embeddings` (embeddings.py); `/health`; `/version` (vLLM's);
`/metrics`; and `/admin/*` (state, faults, reset, ground truth). Every error is an OpenAI
error object; nothing answers with a traceback.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import HttpVersion11, web

from .admin import PoolAdmin
from .api import (
    GenRequest,
    parse_chat,
    parse_completion,
    prompt_token_count,
    prompt_token_list,
    resolve_max_tokens,
)
from .apierror import ApiError
from .embeddings import embeddings_body, parse_embeddings
from .engine import (
    Engine,
    EngineHooks,
    PrefixCache,
    QueueFull,
    SeqParams,
    Sequence,
    StepRecord,
)
from .errors import MAX_BODY_BYTES, error_response, openai_errors, read_json
from .faults import Faults, down_error
from .groundtruth import DEFAULT_REQUEST_CAPACITY, GroundTruth, RequestInfo, request_record
from .metrics import CONTENT_TYPE, Gauges, PoolMetrics
from .profiles import Profile
from .responses import ChunkRenderer, ResponseMeta, completion_body
from .streams import (
    DirectStream,
    expected_length,
    regressed,
    seq_request_id,
    structured_text,
)
from .structured import ScriptedStream, broken_json
from .tasks import task_for
from .textgen import TextKey, TokenSource, TokenStream, stable_hash, stable_unit

LISTEN_BACKLOG = 2048


@dataclass(frozen=True)
class PoolSpec:
    """One simulated pool: a name, an accelerator profile, a port (0 = any free port)."""

    name: str
    profile: Profile
    port: int
    models: tuple[str, ...] = ()  # empty: the profile's models

    @property
    def served_models(self) -> tuple[str, ...]:
        return self.models or self.profile.models



class SimPool(PoolAdmin):
    """One simulated pool: engine, metrics, ground truth, faults and its aiohttp app."""

    def __init__(
        self,
        spec: PoolSpec,
        *,
        record_ground_truth: bool = False,
        ground_truth_size: int = DEFAULT_REQUEST_CAPACITY,
        random_seed: int | None = None,
    ) -> None:
        self.spec = spec
        self.profile = spec.profile
        self.models = spec.served_models
        self.faults = Faults()
        self.ground_truth = GroundTruth(enabled=record_ground_truth, capacity=ground_truth_size)
        self.engine = Engine(spec.profile, pool_name=spec.name, hooks=self._hooks())
        self.metrics = PoolMetrics(spec.name, self.models, Gauges(
            running=lambda m: sum(1 for s in self.engine.running if s.model == m),
            waiting=lambda m: sum(1 for s in self.engine.waiting if s.model == m),
            kv_usage=self.engine.kv_usage,
            lagging=lambda: self.engine.lag.lagging,
        ))
        self.app = self._build_app()
        self.port = spec.port
        self._runner: web.AppRunner | None = None
        # The pool's own random draws (injected errors, replica noise): unseeded as real
        # nondeterminism is, or reproducible per process and pool with `random_seed`.
        self._random = random.Random(
            None if random_seed is None else stable_hash("pool-random", random_seed, spec.name))
        self._fingerprint = f"fp_sim_{spec.profile.name}"

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self, host: str) -> int:
        self._runner = web.AppRunner(
            self.app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, self.spec.port, backlog=LISTEN_BACKLOG)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real port when asked for port 0
        self.engine.start()
        return self.port

    async def stop(self) -> None:
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def banner(self, host: str) -> str:
        return (
            f"sim pool {self.spec.name} ({self.profile.description}) on "
            f"http://{host}:{self.port} models: {', '.join(self.models)}"
        )

    def _build_app(self) -> web.Application:
        app = web.Application(middlewares=[openai_errors], client_max_size=MAX_BODY_BYTES)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.list_models)
        app.router.add_get("/v1/models/{model}", self.get_model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/admin/state", self.admin_state)
        app.router.add_post("/admin/faults", self.admin_faults)
        app.router.add_post("/admin/reset", self.admin_reset)
        app.router.add_get("/admin/ground-truth", self.admin_ground_truth)
        app.router.add_post("/admin/ground-truth", self.admin_ground_truth_set)
        app.router.add_delete("/admin/ground-truth", self.admin_ground_truth_clear)
        return app

    # ---- engine hooks (metrics and ground truth) ---------------------------------------

    def _hooks(self) -> EngineHooks:
        return EngineHooks(
            on_step=self._on_step,
            on_admit=self._on_admit,
            on_tokens=self._on_tokens,
            on_finish=self._on_finish,
            on_flush=self._on_flush,
        )

    def _on_step(self, step: StepRecord, lag: float) -> None:
        self.metrics.schedule_lag.observe(lag)
        if self.ground_truth.enabled:
            self.ground_truth.add_step(step)

    def _on_flush(self, step: StepRecord) -> None:
        if step.flush_s is not None:
            self.metrics.flush.observe(step.flush_s)

    def _on_admit(self, seq: Sequence, cached: int) -> None:
        stats = self.metrics.by_model[seq.model]
        stats.prefix_queries += seq.params.prompt_tokens
        stats.prefix_hits += cached
        if seq.preemptions == 0:
            stats.prompt_tokens += seq.params.prompt_tokens
            stats.queue.observe((seq.admitted or seq.enqueued) - seq.enqueued)

    def _on_tokens(self, seqs: list[Sequence], now: float) -> None:
        by_model = self.metrics.by_model
        for seq in seqs:
            stats = by_model[seq.model]
            stats.generation_tokens += 1
            if seq.generated == 1:
                stats.ttft.observe(now - seq.arrival)
            elif seq.prev_token_at is not None:
                stats.tpot.observe(now - seq.prev_token_at)

    def _on_finish(self, seq: Sequence) -> None:
        if seq.finish_reason is not None:
            stats = self.metrics.by_model[seq.model]
            stats.success[seq.finish_reason] += 1
            stats.e2e.observe((seq.finished_at or seq.arrival) - seq.arrival)
        info = seq.request_info
        if self.ground_truth.enabled and isinstance(info, RequestInfo) and not info.recorded:
            info.recorded = True
            status = 200 if seq.error is None else 499 if seq.error.startswith("client") else 503
            self.ground_truth.add_request(
                request_record(info, seq, status=status, error=seq.error)
            )

    # ---- plain routes ------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.faults.down:
            return web.json_response({"status": "down"}, status=503)
        return web.json_response({"status": "ok"})

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def _model_card(self, model: str) -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": 0,
            "owned_by": "fleetctl-sim",
            "max_model_len": self.profile.max_context,
            # The weights revision served (not vLLM's; an operator swaps it as a fault).
            "revision": self.faults.model_revision,
        }

    async def version(self, request: web.Request) -> web.Response:
        """vLLM's `GET /version`: the server's version (an operator changes it to play an
        upgrade nobody registered)."""
        if self.faults.down:
            raise down_error()
        return web.json_response({"version": self.faults.server_version})

    async def list_models(self, request: web.Request) -> web.Response:
        if self.faults.down:
            raise down_error()
        return web.json_response(
            {"object": "list", "data": [self._model_card(m) for m in self.models]}
        )

    async def get_model(self, request: web.Request) -> web.Response:
        if self.faults.down:
            raise down_error()
        model = request.match_info["model"]
        self._check_model(model)
        return web.json_response(self._model_card(model))

    def _check_model(self, model: str) -> None:
        if model not in self.models:
            raise ApiError(404, f"The model `{model}` does not exist.", param="model",
                           code="model_not_found")

    # ---- generation --------------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def embeddings(self, request: web.Request) -> web.Response:
        """Deterministic vectors from the input (embeddings.py), after the pool's network
        latency; faults apply. Not queued on the engine, not in the ground truth."""
        request_id = request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex}"
        try:
            if self.faults.down:
                raise down_error()
            body = await read_json(request)
            if not isinstance(body, dict):
                raise ApiError(400, "Invalid request body: expected a JSON object.")
            req = parse_embeddings(body)
            self._check_model(req.model)
            await self._network_delay()
            self._maybe_inject_error()
        except ApiError as err:
            return error_response(err, request_id)
        return web.json_response(embeddings_body(req), headers={"x-request-id": request_id})

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        arrival = time.monotonic()
        request_id = request.headers.get("x-request-id") or f"req-{uuid.uuid4().hex}"
        prefix = "chatcmpl-" if endpoint == "chat" else "cmpl-"
        info = RequestInfo(request_id=request_id, response_id=prefix + uuid.uuid4().hex,
                           endpoint=endpoint, model="", stream=False, arrival_mono=arrival)
        try:
            return await self._generate_checked(request, info)
        except ApiError as err:
            if self.ground_truth.enabled and not info.recorded:
                info.recorded = True
                self.ground_truth.add_request(
                    request_record(info, None, status=err.status, error=err.message)
                )
            return error_response(err, request_id)

    async def _generate_checked(
        self, request: web.Request, info: RequestInfo
    ) -> web.StreamResponse:
        if self.faults.down:
            raise down_error()
        body = await read_json(request)
        if not isinstance(body, dict):
            raise ApiError(400, "Invalid request body: expected a JSON object.")
        profile = self.profile
        if info.endpoint == "chat":
            req = parse_chat(body, tool_calls=profile.tool_calls, json_mode=profile.json_mode)
        else:
            req = parse_completion(body)
        # Profile switches that make a pool ignore part of the contract, as some servers do.
        if not profile.stream_usage:
            req.include_usage = False
        if not profile.logprobs:
            req.top_logprobs = None
        info.model, info.stream = req.model, req.stream
        info.tool_call = req.tool_call is not None
        self._check_model(req.model)
        tokens = prompt_token_list(req, profile.tokenizer)
        prompt_tokens = prompt_token_count(req, tokens)
        max_tokens = resolve_max_tokens(req, prompt_tokens, self.profile.max_context)
        await self._network_delay()
        self._maybe_inject_error()
        seq = self._sequence(req, info, tokens, prompt_tokens, max_tokens)
        try:
            self.engine.submit(seq, time.monotonic())
        except QueueFull:
            raise ApiError(429, "The pool's waiting queue is full; retry later.",
                           type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(self._retry_after_s())}) from None
        tool = req.tool_call
        meta = ResponseMeta(response_id=info.response_id, created=int(time.time()),
                            model=req.model, fingerprint=self._fingerprint,
                            endpoint=info.endpoint, prompt_tokens=prompt_tokens,
                            tool_call_id=None if tool is None else
                            f"call_{stable_hash('call', info.response_id):016x}",
                            tool_name=None if tool is None else tool.name)
        if req.stream:
            return await self._stream(request, req, seq, meta)
        return await self._complete(req, seq, meta)

    def _retry_after_s(self) -> int:
        """Whole seconds until the queue has likely moved: the running sequences' remaining
        tokens at the current step time, at least 1 (the Retry-After header)."""
        engine = self.engine
        running = max(1, len(engine.running))
        step_s = self.profile.step_seconds(running, 0, engine.slowdown)
        left = min((max(1, expected_length(s) - s.generated) for s in engine.running),
                   default=1)
        return max(1, min(60, int(left * step_s + 0.999)))

    async def _network_delay(self) -> None:
        delay_ms = self.profile.network_latency_ms + self.faults.added_latency_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000.0)
        if self.faults.down:  # it may have gone down while the request was in flight
            raise down_error()

    def _maybe_inject_error(self) -> None:
        rate = self.faults.error_rate
        if rate > 0 and self._random.random() < rate:
            raise ApiError(500, "Injected fault: simulated internal server error.",
                           type="server_error", code="internal_error")

    def _sequence(
        self, req: GenRequest, info: RequestInfo, tokens: list[str], prompt_tokens: int,
        max_tokens: int,
    ) -> Sequence:
        profile = self.profile
        key = TextKey.of(req.model, req.prompt_text, req.seed)
        stream: TokenSource
        if req.tool_call is not None or req.json_format is not None:
            text = structured_text(req, key)
            if req.tool_call is None and regressed(profile.json_broken, "json-broken",
                                                   profile.name, key):
                text = broken_json(text, stable_unit("json-broken-at", profile.name, key))
                info.regression = "json_broken"
            stream = ScriptedStream(text, key, req.top_logprobs)
        elif (task := task_for(req.model, req.messages, req.prompt_text, req.seed,
                               profile)) is not None:
            # A bundled eval task (tasks.py): solved, right at the profile's task_accuracy.
            stream = ScriptedStream(task, key, req.top_logprobs)
        else:
            stream = TokenStream(
                key=key,
                profile_name=profile.name,
                divergence_rate=profile.divergence_rate,
                near_tie_fraction=profile.near_tie_fraction,
                temperature=req.temperature,
                top_p=req.top_p,
                top_logprobs=req.top_logprobs,
            )
        # A structured answer ends with its JSON, whatever ignore_eos says.
        ignore_eos = req.ignore_eos and isinstance(stream, TokenStream)
        length = max_tokens if ignore_eos else min(max_tokens, stream.natural_length)
        if length > 1 and regressed(profile.truncate_rate, "truncate", profile.name, key):
            # Cut short at 25..60 % of the answer, reported as "length" though max_tokens was
            # far: the regress switch `truncate_rate`.
            share = 0.25 + 0.35 * stable_unit("truncate-at", profile.name, key)
            max_tokens = length = max(1, int(length * share))
            info.regression = "+".join(filter(None, (info.regression, "truncated")))
        if (isinstance(stream, TokenStream) and req.temperature == 0 and req.seed is None
                and profile.replica_noise > 0 and self._random.random() < profile.replica_noise):
            # Replica noise: not keyed, so the same request may flip on one call and not the
            # next, here and not on another endpoint. Only greedy answers: sampled ones differ
            # anyway, and structured ones are scripted. A request that names a `seed` asks for
            # a reproducible answer and gets one, as from a server with batch-invariant
            # kernels: the conformance probe's seed and stop cases send seeds, and judge the
            # contract, not the noise.
            stream.add_flip(self._random.random(), length)
        params = SeqParams(
            model=req.model,
            prompt_tokens=prompt_tokens,
            prefix_hashes=PrefixCache.block_hashes(req.model, tokens),
            max_tokens=max_tokens,
            stops=req.stops,
            ignore_eos=ignore_eos,
        )
        seq = Sequence(params, stream, arrival=info.arrival_mono)
        seq.request_info = info
        if self.ground_truth.enabled:
            seq.token_times = []
            seq.written_times = []
        return seq

    async def _complete(self, req: GenRequest, seq: Sequence, meta: ResponseMeta) -> web.Response:
        try:
            deltas = await seq.wait_done()
        finally:
            self.engine.cancel(seq)  # no-op when it finished; frees it if we were cancelled
        if seq.error is not None or seq.finish_reason is None:
            raise down_error(seq.error or "aborted")
        body = completion_body(meta, deltas, seq.finish_reason, seq.cached_tokens,
                               with_logprobs=req.top_logprobs is not None)
        return web.json_response(body, headers={"x-request-id": seq_request_id(seq)})

    async def _stream(
        self, request: web.Request, req: GenRequest, seq: Sequence, meta: ResponseMeta
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "x-request-id": seq_request_id(seq),
        })
        renderer = ChunkRenderer(meta, req.include_usage, req.top_logprobs is not None)
        transport = request.transport
        direct = request.version >= HttpVersion11 and transport is not None
        if direct:
            response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            await response.write(b"")  # headers now: the client knows it was accepted
            if direct and transport is not None:
                seq.attach_sink(DirectStream(transport, renderer, seq).push)
                await seq.wait_done()
            else:
                await self._stream_via_task(response, renderer, seq)
            if seq.error is not None and not seq.error.startswith("client"):
                await response.write(ChunkRenderer.error_event(down_error(seq.error)))
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client left; the sequence is cancelled below
        finally:
            self.engine.cancel(seq)
        return response

    @staticmethod
    async def _stream_via_task(
        response: web.StreamResponse, renderer: ChunkRenderer, seq: Sequence
    ) -> None:
        """Fallback (HTTP/1.0): this task is woken per token and writes through aiohttp."""
        seq.wake_each_token = True
        while True:
            deltas = await seq.next_output()
            if deltas:
                data = renderer.render(deltas, seq.cached_tokens)
                if data:
                    await response.write(data)
            if seq.done and not seq.pending:
                return


