"""The Lua script that copies a request body's `model` into the route header and estimates
the prompt's tokens into the prompt header (docs/traffic.md, "Prompt size at the gateway")."""

from __future__ import annotations

from fleetctl.traffic.gateways.base import PROMPT_TOKENS_UNKNOWN, DesiredState, PromptCalibration
from fleetctl.traffic.gateways.envoy.affinity import CALLER_KEY_MAX_BYTES, lua_affinity
from fleetctl.traffic.gateways.envoy.names import (
    LUA_MODEL_CLASS,
    POOL_HEADER,
    PROMPT_SCAN_LIMIT_BYTES,
)

_LUA = r"""
-- fleetctl: copy the top-level "model" of a POST /v1/ JSON body into the route header, and
-- estimate the prompt's tokens into the prompt header. Whatever values of those headers the
-- client sent are removed first: clients never pick a route.
local MODEL_HEADER = "@MODEL_HEADER@"
-- The prompt's estimated tokens (or "@PROMPT_UNKNOWN@"), set here from the body like the model;
-- the caller's own count arrives in the stated header (docs/traffic.md, "Prompt size").
local PROMPT_HEADER = "@PROMPT_HEADER@"
local PROMPT_STATED_HEADER = "@PROMPT_STATED_HEADER@"
-- A body larger than this gets no estimate (the pass for the model still reads it whole).
local PROMPT_SCAN_LIMIT = @PROMPT_SCAN_LIMIT@
-- false only in benchmarks/prompt_estimator.py's baseline: the model header alone, no prompt
-- text counted and no prompt header set.
local ESTIMATE = @ESTIMATE@
-- Envoy matches a repeated header by one of its values; joined into one ("EU,US") it matches
-- no pinned route, so an ambiguous jurisdiction is refused rather than guessed.
local JOINED_HEADERS = {"@RESIDENCY_HEADER@", "@LATENCY_HEADER@"}
-- Prefix affinity (affinity.py): per model, the keys its affinity routes hash on, each
-- {header, leading prompt bytes (0: the caller's key only)}; the most bytes any reads; every
-- such header (a client's are removed); the caller's own key.
local AFFINITY = {@AFFINITY@}
local AFFINITY_SCAN = @AFFINITY_SCAN@
local AFFINITY_HEADERS = {@AFFINITY_HEADERS@}
local PREFIX_KEY_HEADER = "@PREFIX_KEY_HEADER@"

-- From just after an opening quote: the index of the closing quote. A quote preceded by an
-- odd number of backslashes is escaped. Plain find (memchr) keeps long prompts cheap.
local function string_end(body, from)
  local i = from
  while true do
    local q = string.find(body, '"', i, true)
    if q == nil then return nil end
    local k = q - 1
    while k >= from and string.byte(body, k) == 92 do k = k - 1 end
    if (q - 1 - k) % 2 == 0 then return q end
    i = q + 1
  end
end

-- One pass over the body: the value of the key "model" of the outermost object (the last
-- one, like Python's json) and the prompt's text. Strings are skipped whole (plain find), so a
-- "model" inside a prompt or a nested object never counts. The text is the bytes of
-- messages[*].content (a string) and of its text parts (messages[*].content[*].text), or of
-- the top-level "prompt"/"input" (a string or strings in an array), as the JSON carries
-- them; a prompt of token ids counts one token per id. Returns model, text bytes, token ids,
-- messages, whether a prompt was found, whether the body read to its end (an unterminated
-- string does not), and the first AFFINITY_SCAN bytes of the text (its strings joined by
-- newlines, as the JSON carries them).
local function scan(body)
  local depth, i, found = 0, 1, nil
  local kinds, keys, top = {}, {}, nil
  local bytes, ids, messages, seen = 0, 0, 0, false
  local array_start, array_bytes = nil, 0
  local parts, taken = {}, 0
  local function take(from, to)
    if taken < AFFINITY_SCAN then
      local piece = string.sub(body, from, math.min(to, from + AFFINITY_SCAN - taken - 1))
      parts[#parts + 1] = piece
      taken = taken + #piece + 1
    end
  end
  while true do
    local j = string.find(body, '[{}%[%]"]', i)
    if j == nil then
      return found, bytes, ids, messages, seen, true, table.concat(parts, "\n")
    end
    local c = string.byte(body, j)
    if c == 34 then
      local close = string_end(body, j + 1)
      if close == nil then return nil, 0, 0, 0, false, false end
      i = close + 1
      local _, colon = nil, nil
      if kinds[depth] == 123 and (ESTIMATE or depth == 1) then
        _, colon = string.find(body, '^%s*:%s*', i)
      end
      if colon ~= nil then
        -- A key: only short ones matter.
        local name = close - j <= 9 and string.sub(body, j + 1, close - 1) or ""
        keys[depth] = name
        if depth == 1 then
          top = name
          if name == "messages" or name == "prompt" or name == "input" then seen = true end
          if name == "model" then
            found = nil
            if string.byte(body, colon + 1) == 34 then
              local value_end = string_end(body, colon + 2)
              if value_end == nil then return nil, 0, 0, 0, false, false end
              found = string.sub(body, colon + 2, value_end - 1)
              i = value_end + 1
            end
          end
        end
      elseif not ESTIMATE then
        -- A string value: nothing to count.
      elseif top == "messages" then
        local key = keys[depth]
        if (depth == 3 and key == "content") or (depth == 5 and key == "text") then
          bytes = bytes + (close - j - 1)
          take(j + 1, close - 1)
        end
      elseif (top == "prompt" or top == "input") and (depth == 1 or depth == 2) then
        bytes = bytes + (close - j - 1)
        take(j + 1, close - 1)
      end
    elseif c == 123 or c == 91 then
      depth = depth + 1
      kinds[depth] = c
      keys[depth] = nil
      if not ESTIMATE then
        -- Only the depth matters.
      elseif c == 123 and depth == 3 and top == "messages" and kinds[2] == 91 then
        messages = messages + 1
      elseif c == 91 and depth == 2 and (top == "prompt" or top == "input") then
        array_start, array_bytes = j, bytes
      end
      i = j + 1
    else
      if ESTIMATE and depth == 2 and array_start ~= nil and bytes == array_bytes then
        -- An array of token ids: one token per id (its commas + 1).
        local span = string.sub(body, array_start + 1, j - 1)
        if string.find(span, "%d") then
          ids = ids + select(2, string.gsub(span, ",", ",")) + 1
        end
      end
      if depth == 2 then array_start = nil end
      depth = depth - 1
      i = j + 1
    end
  end
end

-- Per model: {chars per token, tokens per message, base tokens}, the most conservative
-- (most tokens) of the pools its routes may send to; DEFAULT_CALIBRATION for any other.
local CALIBRATION = {@CALIBRATION@}
local DEFAULT_CALIBRATION = {@DEFAULT_CALIBRATION@}

local function estimate(cal, bytes, ids, messages)
  return math.ceil(cal[3] + cal[2] * messages + bytes / cal[1]) + ids
end

-- Two polynomial hashes (each exact in a double) of the text: 64 bits, as hex.
local function prefix_hash(text)
  local h1, h2 = 0, 0
  for k = 1, #text do
    local b = string.byte(text, k)
    h1 = (h1 * 257 + b) % 4294967291
    h2 = (h2 * 263 + b) % 4294967279
  end
  return string.format("%08x%08x", h1, h2)
end

-- Each affinity key of the model's routes: the caller's key when it sent one, else the hash
-- of the prompt's leading bytes (for a `prompt` key, when the body had a prompt).
local function set_affinity(headers, model, caller, prefix)
  for _, key in ipairs(AFFINITY[model or ""] or {}) do
    if caller ~= nil and #caller > 0 then
      headers:replace(key[1], "k:" .. string.sub(caller, 1, @CALLER_KEY_MAX@))
    elseif key[2] > 0 and prefix ~= nil and #prefix > 0 then
      headers:replace(key[1], "p:" .. prefix_hash(string.sub(prefix, 1, key[2])))
    end
  end
end

-- The caller's own count: digits only, at most 9 of them; else none.
local function stated(headers)
  local value = headers:get(PROMPT_STATED_HEADER)
  if value ~= nil and #value <= 9 and string.find(value, "^%d+$") then
    return tonumber(value)
  end
  return nil
end

function envoy_on_request(handle)
  local headers = handle:headers()
  headers:remove(MODEL_HEADER)
  headers:remove(PROMPT_HEADER)
  for _, name in ipairs(AFFINITY_HEADERS) do headers:remove(name) end
  for _, name in ipairs(JOINED_HEADERS) do
    if headers:getNumValues(name) > 1 then headers:replace(name, headers:get(name)) end
  end
  local path = headers:get(":path") or ""
  if headers:get(":method") == "POST" and string.sub(path, 1, 4) == "/v1/" then
    local claimed = ESTIMATE and stated(headers) or nil
    local caller = headers:get(PREFIX_KEY_HEADER)
    -- body() waits for the whole body; wrappers taken before it are stale afterwards.
    local body = handle:body()
    local tokens = nil
    if body ~= nil and body:length() > 0 then
      local length = body:length()
      local model, bytes, ids, messages, seen, whole, prefix = scan(body:getBytes(0, length))
      if model ~= nil and #model <= 256 and string.find(model, "^@MODEL_CLASS@+$") then
        handle:headers():replace(MODEL_HEADER, model)
        set_affinity(handle:headers(), model, caller, prefix)
      end
      local cal = CALIBRATION[model or ""] or DEFAULT_CALIBRATION
      if ESTIMATE and whole and seen and length <= PROMPT_SCAN_LIMIT then
        tokens = estimate(cal, bytes, ids, messages)
      elseif claimed ~= nil and claimed < length / cal[1] then
        -- Nothing to check the caller's count against (too large to scan, no prompt found,
        -- not JSON): it stands only when the body's bytes could not hold more tokens, so a
        -- huge body stated as small is "unknown" (the last tier), never a small pool's.
        claimed = nil
      end
    end
    -- The larger of the estimate and the caller's count: a caller can ask for a larger
    -- device, never talk itself onto a smaller one. Unreadable: the caller's, or unknown.
    if tokens ~= nil and claimed ~= nil and claimed > tokens then tokens = claimed end
    if tokens == nil then tokens = claimed end
    if ESTIMATE then
      handle:headers():replace(PROMPT_HEADER, tokens ~= nil and string.format("%d", tokens)
                               or "@PROMPT_UNKNOWN@")
    end
  end
  handle:clearRouteCache()
end
"""

# Only in the script of a gateway that has a `queue` tier: every other gateway's answers go
# by without a Lua call.
_LUA_QUEUE_FULL = r"""
-- A `queue` tier whose queue is full: Envoy refused the request itself, a 503 naming no
-- pool (no endpoint was picked) whose text says "overflow" (the tier's circuit breaker,
-- measured with Envoy 1.40: fallback.py). The tier's entry carries the answer to give instead
-- (429, Retry-After, an OpenAI-style error: routes.queue_full_answer). Any other passes.
function envoy_on_response(handle)
  local metadata = handle:metadata()
  local answer = metadata:get("queue_full_body")
  if answer == nil then return end
  local retry_after = metadata:get("retry_after")
  local headers = handle:headers()
  if headers:get(":status") ~= "503" or headers:get("@POOL_HEADER@") ~= nil then return end
  -- body() waits for the whole (short) answer; wrappers taken before it are stale after.
  local body = handle:body()
  if body == nil then return end
  if not string.find(body:getBytes(0, body:length()), "overflow", 1, true) then return end
  body:setBytes(answer)
  headers = handle:headers()
  headers:replace(":status", "429")
  headers:replace("retry-after", retry_after)
  headers:replace("content-type", "application/json")
end
"""

# Before the first routes file arrives: still never let a client-sent header through.
LUA_DEFAULT = r"""
function envoy_on_request(handle)
  handle:headers():remove("@MODEL_HEADER@")
  handle:headers():remove("@PROMPT_HEADER@")
end
"""


def default_lua() -> str:
    return (LUA_DEFAULT.replace("@MODEL_HEADER@", DesiredState.model_header)
            .replace("@PROMPT_HEADER@", DesiredState.prompt_tokens_header).lstrip())


def model_calibrations(desired: DesiredState) -> dict[str, PromptCalibration]:
    """Per model, the most conservative calibration (the most tokens for any prompt) of the
    pools its routes may send to, weight 0 included: an estimate never undercounts for the
    smallest device among them."""
    by_model: dict[str, list[PromptCalibration]] = {}
    for route in desired.routes:
        cals = by_model.setdefault(route.model, [])
        cals += [desired.pools[p].prompt for p in sorted(route.weights) if p in desired.pools]
    return {model: PromptCalibration(
        chars_per_token=min(c.chars_per_token for c in cals),
        per_message=max(c.per_message for c in cals),
        base=max(c.base for c in cals),
        source=", ".join(sorted({c.source for c in cals})),
    ) for model, cals in sorted(by_model.items()) if cals}


def _lua_calibration(cal: PromptCalibration) -> str:
    return f"{cal.chars_per_token!r}, {cal.per_message!r}, {cal.base!r}"


def routing_lua(desired: DesiredState, *, estimate: bool = True) -> str:
    """The per-request script for these routes (header names are validated tokens, model
    names have only MODEL_CHARS: neither needs escaping in a Lua string). `estimate=False`
    renders it without the prompt estimator (the model header alone): only the benchmark's
    baseline uses it, so the baseline is this script and cannot drift from it."""
    queues = any(tier.behaviour == "queue" and tier.pools
                 for route in desired.routes if route.weights for tier in route.tiers)
    table = "".join(f'\n  ["{model}"] = {{{_lua_calibration(cal)}}},'
                    for model, cal in model_calibrations(desired).items())
    script = _LUA + (_LUA_QUEUE_FULL if queues else "")
    affinity, affinity_scan, affinity_headers = lua_affinity(desired)
    return (script.replace("@AFFINITY@", affinity)
            .replace("@AFFINITY_SCAN@", str(affinity_scan))
            .replace("@AFFINITY_HEADERS@", ", ".join(f'"{h}"' for h in affinity_headers))
            .replace("@PREFIX_KEY_HEADER@", desired.prefix_key_header)
            .replace("@CALLER_KEY_MAX@", str(CALLER_KEY_MAX_BYTES))
            .replace("@MODEL_HEADER@", desired.model_header)
            .replace("@RESIDENCY_HEADER@", desired.residency_header)
            .replace("@LATENCY_HEADER@", desired.latency_class_header)
            .replace("@PROMPT_STATED_HEADER@", desired.prompt_tokens_stated_header)
            .replace("@PROMPT_HEADER@", desired.prompt_tokens_header)
            .replace("@PROMPT_UNKNOWN@", PROMPT_TOKENS_UNKNOWN)
            .replace("@PROMPT_SCAN_LIMIT@", str(PROMPT_SCAN_LIMIT_BYTES))
            .replace("@ESTIMATE@", "true" if estimate else "false")
            .replace("@CALIBRATION@", table + ("\n" if table else ""))
            .replace("@DEFAULT_CALIBRATION@", _lua_calibration(PromptCalibration()))
            .replace("@MODEL_CLASS@", LUA_MODEL_CLASS)
            .replace("@POOL_HEADER@", POOL_HEADER).lstrip())
