"""What the cases send and to whom: the fixed requests, a case's outcome, and the probe that
talks to one endpoint of one pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetctl.core.http import Client, OutboundError, OutboundResponse

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"
EXCERPT_CHARS = 1500
UNKNOWN_MODEL = "fleetctl-conformance-no-such-model"
SATURATION_REQUESTS = 1024
SATURATION_WAVES = 3

MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]
PROMPT = "The three primary colours are"
# The message sets whose prompt-token counts must match the reference pool's.
PARITY_MESSAGES: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hello!"}],
    MESSAGES,
    [{"role": "system", "content": "You answer questions about shipping logistics."},
     {"role": "user", "content": "How long does a container take from Rotterdam to Shanghai?"},
     {"role": "assistant", "content": "About 30 to 35 days by sea, depending on the route."},
     {"role": "user", "content": "And by rail, through Kazakhstan? Give a range in days."}],
    # A longer passage of ordinary prose: what a short set cannot tell, how many characters
    # this tokenizer puts in a token of running text (the gateway's prompt-size estimate is
    # calibrated from it: fleetctl/conformance/calibration.py).
    [{"role": "user", "content": (
        "Summarise the following report in three sentences.\n\n"
        "The regional water authority spent most of last year replacing old pipes in the "
        "northern districts, where leaks had cost roughly a fifth of the treated supply. "
        "Crews worked at night to keep streets open during the day, and residents were told "
        "about each closure a week in advance by letter and text message. The project "
        "finished two months late, mainly because a supplier of steel fittings went out of "
        "business in the spring, but it stayed within its budget of 41 million euros. "
        "Early measurements suggest that losses have fallen to about eight percent, which "
        "would make the network one of the most efficient in the country. The authority "
        "now plans to install smart meters in every household by 2028, so that unusual "
        "consumption can be spotted within hours instead of months. Critics argue that the "
        "meters raise questions about privacy, and a local council has asked for an "
        "independent review before any data is shared with third parties. Meanwhile, the "
        "cost of a cubic metre of water will rise by three percent next January, the first "
        "increase in five years, to pay for a new treatment plant on the river's southern "
        "bank. Managers expect the plant to open in late autumn, provided that the weather "
        "allows the foundations to be poured before the first frost."
    )}],
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                   "population": {"type": "integer"}},
    "required": ["city", "country"],
}


@dataclass
class Outcome:
    status: str
    expected: str
    got: str
    brief: str = ""  # the phrase the run's summary uses when this case does not pass
    request: Any = None
    response: str = ""
    latency_ms: float | None = None
    numbers: dict[str, Any] = field(default_factory=dict)


class Probe:
    """One endpoint of one pool, as the cases talk to it. Answers are kept per endpoint so a
    parity case asks the reference pool only once."""

    def __init__(self, *, pool_name: str, base_url: str, model: str, expected_models: list[str],
                 registry_max_context: int | None, timeout_s: float = 30.0) -> None:
        self.pool_name = pool_name
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.expected_models = expected_models
        self.registry_max_context = registry_max_context
        self.timeout_s = timeout_s
        self.client = Client(base_url=self.base_url, timeout_s=timeout_s,
                             headers={"Authorization": "Bearer fleetctl-conformance"})
        self._memo: dict[str, Any] = {}

    def close(self) -> None:
        self.client.close()

    def post(self, path: str, body: Any = None, *, content: bytes | None = None
             ) -> OutboundResponse:
        if content is not None:
            return self.client.post(path, content=content,
                                    headers={"Content-Type": "application/json"})
        return self.client.post(path, json=body)

    def chat(self, **fields: Any) -> tuple[dict[str, Any], OutboundResponse]:
        body = {"model": self.model, "messages": MESSAGES, "max_tokens": 16,
                "temperature": 0, **fields}
        return body, self.post("/v1/chat/completions", body)

    def models_card(self) -> tuple[OutboundResponse | None, dict[str, Any] | None]:
        """GET /v1/models once; (the answer, this model's card or None)."""
        if "models" not in self._memo:
            try:
                answer: OutboundResponse | None = self.client.get("/v1/models")
            except OutboundError:
                answer = None
            card = None
            if answer is not None and answer.status_code == 200:
                try:
                    data = answer.json().get("data") or []
                    card = next((m for m in data if isinstance(m, dict)
                                 and m.get("id") == self.model), None)
                except (ValueError, AttributeError):
                    card = None
            self._memo["models"] = (answer, card)
        return self._memo["models"]  # type: ignore[no-any-return]

    def max_context(self) -> tuple[int | None, str]:
        """The model's context window and where it was read: the server's `max_model_len`
        from /v1/models when it reports one, else the pool registry's entry."""
        _, card = self.models_card()
        reported = (card or {}).get("max_model_len")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
            return reported, "max_model_len from /v1/models"
        if self.registry_max_context:
            return self.registry_max_context, "the pool registry's max context"
        return None, "unknown"

    def prompt_tokens(self, index: int) -> tuple[int | None, str]:
        """usage.prompt_tokens for PARITY_MESSAGES[index] (max_tokens 1), or why not."""
        key = f"prompt_tokens:{index}"
        if key not in self._memo:
            try:
                _, answer = self.chat(messages=PARITY_MESSAGES[index], max_tokens=1)
            except OutboundError as exc:
                self._memo[key] = (None, f"no answer: {exc}")
                return self._memo[key]  # type: ignore[no-any-return]
            value, why = None, f"HTTP {answer.status_code}"
            if answer.status_code == 200:
                try:
                    value = answer.json()["usage"]["prompt_tokens"]
                    why = ""
                except (ValueError, KeyError, TypeError):
                    why = "no usage.prompt_tokens in the answer"
            self._memo[key] = (value, why)
        return self._memo[key]  # type: ignore[no-any-return]
