-- Argo CD health check for mailer.dev/MailerPipeline (Lua 5.1, as Argo CD runs it).
-- Install it with examples/argocd/argocd-cm.yaml. docs/operations.md lists every
-- condition reason and how it is classified here; tests/operations.rs holds the two
-- together and to the operator's list of reasons.
--
--   Healthy      Ready is True for the current generation.
--   Progressing  no status yet, a status of an older generation, or a reason that
--                passes by itself (workers rolling out, the broker briefly away).
--   Degraded     a reason that needs a person (a conflict, a missing Secret or key,
--                a refused reference, an invalid spec), or one this check does not know.

-- Reasons the operator retries by itself, that pass without anyone changing anything.
local passes_by_itself = {
  DeploymentMissing = true,      -- the worker Deployment is about to be made
  WorkersNotReady = true,        -- workers rolling out or starting
  Unreachable = true,            -- the management API did not answer; retried
  KubeApi = true,                -- the Kubernetes API failed a call; retried
  Cluster = true,                -- the RabbitmqCluster is still being created
}

-- Reasons that wait for a person to change the spec, a Secret or the broker.
local needs_a_person = {
  InvalidSpec = true,
  MissingSecret = true,
  MissingSecretKey = true,
  InvalidSecretValue = true,     -- e.g. a provider CA that is not a PEM certificate
  BadEndpoint = true,
  Unauthorized = true,
  Forbidden = true,
  Conflict = true,
  IncompleteObject = true,
  Unreadable = true,             -- a MailerPipeline newer than the operator
  NotAllowed = true,             -- a clusterRef to another namespace, not allowed there
  AutoscalingUnavailable = true, -- autoscaling asked for, KEDA not installed
  QueueNotEmpty = true,          -- a rename or vhost change would strand mail
  PolicyShadowed = true,         -- another policy applies to a queue instead of ours
  CleanupIncomplete = true,      -- a deleted pipeline left something in RabbitMQ
  ProviderRefusesKey = true,     -- the mail provider refuses the workers' key
}

local function condition(conditions, wanted)
  for _, c in ipairs(conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function said(c)
  if c.message ~= nil and c.message ~= "" then
    return c.reason .. ": " .. c.message
  end
  return c.reason
end

local hs = {}
local status = obj.status
if status == nil or status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report the pipeline's status"
  return hs
end

local ready = condition(status.conditions, "Ready")
if ready == nil or ready.reason == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report the Ready condition"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
local observed = ready.observedGeneration or status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on generation " .. tostring(generation)
    .. " (the status is of generation " .. tostring(observed) .. ")"
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "the pipeline sends mail"
  return hs
end

local reason = ready.reason
if passes_by_itself[reason] then
  hs.status = "Progressing"
elseif needs_a_person[reason] then
  hs.status = "Degraded"
elseif reason == "Refused" then
  -- RabbitMQ refused a request: "refused to <action> (<HTTP status>): …". A server
  -- error (5xx, or 0: no response) is retried; a client error (4xx) needs a person.
  local code = tonumber(string.match(ready.message or "", "refused to .- %((%d+)%)"))
  if code ~= nil and code >= 400 and code < 500 then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
else
  -- A reason newer than this check: show it rather than hide it.
  hs.status = "Degraded"
  hs.message = said(ready) .. " (a reason this health check does not know: update it from deploy/argocd/health.lua)"
  return hs
end
hs.message = said(ready)
return hs
