-- On the way in, remembers the client's HTTP method for the access log.
-- On the way out, reshapes the transcoder's JSON gRPC errors (a google.rpc.Status) into RFC 7807
-- application/problem+json (OpenAI's error object on OpenAI's paths, A2A's on A2A's). LuaJIT in Envoy has no JSON library, so this scans
-- just enough JSON to copy values through verbatim (they are already escaped).

-- The error table (turnmesh.runtime.errors), rendered by envoy/config.py:
-- BASE, BY_CODE[grpc code] = {slug, title, OpenAI type, grpc code, JSON-RPC code} and
-- BY_REASON[ErrorInfo.reason] = {slug, title, OpenAI type, grpc code, JSON-RPC code}, and
-- CODE_NAMES[grpc code] = its name (NOT_FOUND).
__ERROR_TABLE__

-- The row for a status: by its reason (when that reason has a row of its own
-- for this code), else by its code.
local function row_for(code, reason)
  local by_reason = reason and BY_REASON[reason]
  if by_reason ~= nil and by_reason[4] == code then return by_reason end
  return BY_CODE[code] or {"error", "Error", "server_error"}
end

-- The end index of the JSON value that starts at i (string, number, literal,
-- object or array), honouring strings and escapes.
local function value_end(s, i)
  local c = s:sub(i, i)
  if c == '"' then
    local j = i + 1
    while j <= #s do
      local d = s:sub(j, j)
      if d == "\\" then j = j + 2
      elseif d == '"' then return j
      else j = j + 1 end
    end
    return nil
  elseif c == "{" or c == "[" then
    local depth, j = 0, i
    while j <= #s do
      local d = s:sub(j, j)
      if d == '"' then
        j = value_end(s, j)
        if j == nil then return nil end
      elseif d == "{" or d == "[" then depth = depth + 1
      elseif d == "}" or d == "]" then
        depth = depth - 1
        if depth == 0 then return j end
      end
      j = j + 1
    end
    return nil
  else
    local j = s:find("[,}%]]", i)
    return j and j - 1 or #s
  end
end

-- The raw JSON text of the first member named `key`, or nil.
local function member(s, key)
  local _, e = s:find('"' .. key .. '"%s*:%s*')
  if e == nil then return nil end
  local stop = value_end(s, e + 1)
  if stop == nil then return nil end
  return s:sub(e + 1, stop)
end

-- A2A's HTTP+JSON paths (its proto's own bindings, bare or under a tenant):
-- /message:send, /message:stream, /tasks..., /extendedAgentCard, and cards.
local function a2a_path(path)
  local under_tenant = path:match("^/[^/]+(/.*)$")
  for _, p in ipairs({path, under_tenant}) do
    if p == "/message:send" or p == "/message:stream" or p == "/tasks" or p:find("^/tasks/")
        or p == "/extendedAgentCard" or p == "/.well-known/agent-card.json" then
      return true
    end
  end
  return false
end

-- The transcoder rewrites every REST call into a gRPC POST; keep the method the
-- client sent for the access log, and which error shape the caller expects.
local MAX_REQUEST_BYTES = __MAX_REQUEST_BYTES__
-- The request's headers as gRPC counts metadata (each name and value, and 32
-- bytes more per header), request line included: the servers accept more than
-- this plus what Envoy adds, so a call that passes is never refused for its
-- metadata upstream (envoy/guards.py).
local MAX_HEADER_BYTES = __MAX_HEADER_BYTES__

local function header_bytes(headers)
  local size = 0
  for name, value in pairs(headers) do
    size = size + #name + #value + 32
  end
  return size
end

function envoy_on_request(handle)
  local headers = handle:headers()
  -- gRPC as Envoy sees it: application/grpc or application/grpc+NAME (not grpc-web).
  local content_type = headers:get("content-type") or ""
  local grpc = content_type == "application/grpc" or content_type:sub(1, 17) == "application/grpc+"
  local header_size = header_bytes(headers)
  if header_size > MAX_HEADER_BYTES then
    -- gRPC callers get INVALID_ARGUMENT: sending it again cannot succeed.
    handle:respond({[":status"] = "431", ["grpc-status"] = grpc and "3" or nil},
      "the request's headers are " .. header_size
      .. " bytes (names and values, 32 more for each header); the limit is " .. MAX_HEADER_BYTES)
    return
  end
  -- Refuse an oversize body from its Content-Length, before it is sent: a
  -- client using Expect: 100-continue then never uploads it. (The buffer
  -- filter still catches bodies without a length.)
  local length = tonumber(headers:get("content-length") or "")
  if length ~= nil and length > MAX_REQUEST_BYTES and not grpc then
    handle:respond({[":status"] = "413"}, "the request body is " .. length
      .. " bytes; the limit is " .. MAX_REQUEST_BYTES)
    return
  end
  headers:replace("x-turnmesh-original-method", headers:get(":method") or "")
  -- The request's id (Envoy makes one for every request from outside): a
  -- problem's `instance`, as in the access log and the turn's log line.
  local request_id = headers:get("x-request-id") or ""
  if #request_id <= 128 and request_id:find("^[%w%-]+$") then
    handle:streamInfo():dynamicMetadata():set("turnmesh", "request_id", request_id)
  end
  local path = headers:get(":path") or ""
  if path:find("^/v1/chat/completions") or path:find("^/v1/responses")
      or path:find("^/v1/models") then
    handle:streamInfo():dynamicMetadata():set("turnmesh", "error_shape", "openai")
  end
  local bare = path:match("^[^?]*")
  -- A2A's JSON-RPC endpoints (an agent's, and the default agent's).
  if bare == "/jsonrpc" or bare:find("^/[^/]+/jsonrpc$") then
    handle:streamInfo():dynamicMetadata():set("turnmesh", "error_shape", "jsonrpc")
  end
  if a2a_path(bare) then
    handle:streamInfo():dynamicMetadata():set("turnmesh", "error_shape", "a2a")
    -- a2a-sdk's REST client POSTs :subscribe (bodiless), which A2A's own rule binds to GET.
    if headers:get(":method") == "POST" and bare:find("/tasks/[^/]+:subscribe$") then
      headers:replace(":method", "GET")
    end
  end
end

-- `,"instance":"<request id>"`, or nothing for a request without one.
local function instance(handle)
  local ours = handle:streamInfo():dynamicMetadata():get("turnmesh")
  local request_id = ours ~= nil and ours["request_id"] or nil
  if request_id == nil then return "" end
  return ',"instance":"' .. request_id .. '"'
end

-- OpenAI's clients expect OpenAI's error shape on OpenAI's paths.
local function openai_error(text, row, reason)
  local violations = member(text, "fieldViolations")
  local param = violations and member(violations, "field") or member(text, "param") or "null"
  local error_code = reason and ('"' .. reason:lower() .. '"') or "null"
  return '{"error":{"message":' .. (member(text, "message") or '""')
    .. ',"type":"' .. row[3] .. '"'
    .. ',"param":' .. param .. ',"code":' .. error_code .. "}}"
end

-- A2A's HTTP+JSON clients read a google.rpc.Status in Google's HTTP shape:
-- {"error": {"code": <HTTP status>, "status": "NOT_FOUND", "message", "details"}};
-- ErrorInfo (A2A's reason, e.g. TASK_NOT_FOUND) rides in details as sent.
local function a2a_error(text, status, code)
  return '{"error":{"code":' .. status .. ',"status":"' .. (CODE_NAMES[code] or "UNKNOWN")
    .. '","message":' .. (member(text, "message") or '""')
    .. ',"details":' .. (member(text, "details") or "[]") .. "}}"
end

-- A2A's JSON-RPC clients read a JSON-RPC error response; the request's id is
-- the server's to echo, so a status that never reached it answers id null.
local function jsonrpc_error(text, row)
  return '{"jsonrpc":"2.0","id":null,"error":{"code":' .. (row[5] or -32603)
    .. ',"message":' .. (member(text, "message") or '""')
    .. ',"data":' .. (member(text, "details") or "[]") .. "}}"
end

-- What a value of each proto type must look like in JSON.
local EXPECTED = {
  TYPE_BYTES = "base64", TYPE_BOOL = "a boolean", TYPE_ENUM = "one of the enum's names",
  TYPE_INT32 = "an integer", TYPE_INT64 = "an integer", TYPE_UINT32 = "an integer",
  TYPE_UINT64 = "an integer", TYPE_DOUBLE = "a number", TYPE_FLOAT = "a number",
  TYPE_STRING = "a string",
}

-- The transcoder's own 400 for a value of the wrong type echoes the value (a
-- 50 MB file's worth, for bad base64) and names no field in a structured way:
-- the field and what it must be, from its message (a JSON string), or nil.
local function typed_value(message)
  if message == nil then return nil end
  local field, kind = message:match('^"([%w_%.%[%]]+): invalid value .* for type ([%w_%.%/]+)"$')
  if field == nil then return nil end
  -- An enum (or message) type is named by its type URL: its last part.
  return field, "must be " .. (EXPECTED[kind] or ("a valid " .. kind:match("([%w_]+)$")))
end

-- Such a 400 as a problem with a field violation and no echo.
local function typed_value_problem(handle, text)
  local field, description = typed_value(member(text, "detail"))
  if field == nil then return end
  local row = BY_CODE[3]
  local body = '{"type":"' .. BASE .. row[1] .. '","title":"' .. row[2] .. '","status":400,'
    .. '"detail":"' .. field .. ' ' .. description .. '","grpc_code":3,'
    .. '"violations":[{"field":"' .. field .. '","description":"' .. description .. '"}]'
    .. instance(handle) .. "}"
  handle:body():setBytes(body)
end

-- On A2A's paths (the edge's reply already in A2A's shape): A2A's
-- InvalidParams, with the field violation, and no echo.
local function typed_value_a2a(handle, text)
  local field, description = typed_value(member(text, "message"))
  if field == nil then return end
  handle:body():setBytes('{"error":{"code":400,"status":"INVALID_ARGUMENT","message":"'
    .. field .. ' ' .. description .. '","details":['
    .. '{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS",'
    .. '"domain":"a2a-protocol.org"},'
    .. '{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"'
    .. field .. '","description":"' .. description .. '"}]}]}}')
end

function envoy_on_response(handle)
  -- A JSON-RPC error that keeps its HTTP status (a2a/jsonrpc.py) says which.
  local kept = handle:headers():get("x-turnmesh-jsonrpc-status")
  if kept ~= nil then
    handle:headers():remove("x-turnmesh-jsonrpc-status")
    if kept:find("^[45]%d%d$") then handle:headers():replace(":status", kept) end
    return
  end
  local status = tonumber(handle:headers():get(":status")) or 200
  local content_type = handle:headers():get("content-type") or ""
  if status == 400 and content_type == "application/problem+json" then
    local body = handle:body()
    if body ~= nil then typed_value_problem(handle, body:getBytes(0, body:length())) end
    return
  end
  if status < 400 or content_type:sub(1, 16) ~= "application/json" then
    return
  end
  local body = handle:body()
  if body == nil then return end
  local text = body:getBytes(0, body:length())
  local shape = handle:streamInfo():dynamicMetadata():get("turnmesh")
  local a2a = shape ~= nil and shape["error_shape"] == "a2a"
  if a2a and status == 400 and text:find('^%s*{%s*"error"') then
    typed_value_a2a(handle, text)  -- the edge's own reply (a2a_replies.py)
    return
  end
  local code = tonumber(text:match('^%s*{%s*"code"%s*:%s*(%d+)'))
  if code == nil then return end
  local quoted = member(text, "reason")
  local reason = quoted and quoted:match('^"([^"\\]+)"$')
  local row = row_for(code, reason)
  if shape ~= nil and shape["error_shape"] == "openai" then
    handle:body():setBytes(openai_error(text, row, reason))
    return
  end
  if shape ~= nil and shape["error_shape"] == "jsonrpc" then
    handle:body():setBytes(jsonrpc_error(text, row))
    return
  end
  if a2a then
    handle:body():setBytes(a2a_error(text, status, code))
    return
  end
  local parts = {
    '{"type":"' .. BASE .. row[1] .. '"',
    '"title":"' .. row[2] .. '"',
    '"status":' .. status,
    '"detail":' .. (member(text, "message") or '""'),
    '"grpc_code":' .. code,
  }
  local violations = member(text, "fieldViolations")
  if violations ~= nil then
    parts[#parts + 1] = '"violations":' .. violations
  end
  if quoted ~= nil then
    parts[#parts + 1] = '"reason":' .. quoted
  end
  handle:body():setBytes(table.concat(parts, ",") .. instance(handle) .. "}")
  handle:headers():replace("content-type", "application/problem+json")
end
