"""The Lua script that copies a request body's `model` into the route header."""

from __future__ import annotations

from fleetctl.traffic.gateways.base import DesiredState
from fleetctl.traffic.gateways.envoy.names import LUA_MODEL_CLASS

_LUA = r"""
-- fleetctl: copy the top-level "model" of a POST /v1/ JSON body into the route header.
-- Whatever value of that header the client sent is removed first: clients never pick a route.
local MODEL_HEADER = "@MODEL_HEADER@"
-- Envoy matches a repeated header by one of its values; joined into one ("EU,US") it matches
-- no pinned route, so an ambiguous jurisdiction is refused rather than guessed.
local JOINED_HEADERS = {"@RESIDENCY_HEADER@", "@LATENCY_HEADER@"}

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

-- The value of the key "model" of the outermost object (the last one, like Python's json),
-- or nil. Strings are skipped whole, so a "model" inside a prompt or a nested object never
-- counts.
local function top_level_model(body)
  local depth, i, found = 0, 1, nil
  while true do
    local j = string.find(body, '[{}%[%]"]', i)
    if j == nil then return found end
    local c = string.byte(body, j)
    if c == 34 then
      local close = string_end(body, j + 1)
      if close == nil then return nil end
      i = close + 1
      if depth == 1 and close - j == 6 and string.sub(body, j + 1, close - 1) == "model" then
        local _, colon = string.find(body, '^%s*:%s*', i)
        if colon ~= nil then
          found = nil
          if string.byte(body, colon + 1) == 34 then
            local value_end = string_end(body, colon + 2)
            if value_end == nil then return nil end
            found = string.sub(body, colon + 2, value_end - 1)
            i = value_end + 1
          end
        end
      end
    elseif c == 123 or c == 91 then
      depth = depth + 1
      i = j + 1
    else
      depth = depth - 1
      i = j + 1
    end
  end
end

function envoy_on_request(handle)
  local headers = handle:headers()
  headers:remove(MODEL_HEADER)
  for _, name in ipairs(JOINED_HEADERS) do
    if headers:getNumValues(name) > 1 then headers:replace(name, headers:get(name)) end
  end
  local path = headers:get(":path") or ""
  if headers:get(":method") == "POST" and string.sub(path, 1, 4) == "/v1/" then
    -- body() waits for the whole body; wrappers taken before it are stale afterwards.
    local body = handle:body()
    if body ~= nil and body:length() > 0 then
      local model = top_level_model(body:getBytes(0, body:length()))
      if model ~= nil and #model <= 256 and string.find(model, "^@MODEL_CLASS@+$") then
        handle:headers():replace(MODEL_HEADER, model)
      end
    end
  end
  handle:clearRouteCache()
end
"""

# Before the first routes file arrives: still never let a client-sent header through.
LUA_DEFAULT = r"""
function envoy_on_request(handle)
  handle:headers():remove("@MODEL_HEADER@")
end
"""


def routing_lua(desired: DesiredState) -> str:
    """The per-request script for these routes (header names are validated tokens)."""
    return (_LUA.replace("@MODEL_HEADER@", desired.model_header)
            .replace("@RESIDENCY_HEADER@", desired.residency_header)
            .replace("@LATENCY_HEADER@", desired.latency_class_header)
            .replace("@MODEL_CLASS@", LUA_MODEL_CLASS).lstrip())
