-- Argo CD health of a gpushare.dev ElasticModel, from the conditions the gpushare controller writes.
-- Healthy: Ready=True for the current generation. Degraded: Degraded=True (the user must act; the
-- message says how). Progressing: no status yet, status for an older generation, or not ready yet.
-- Written for Lua 5.1 (Argo CD's gopher-lua). Also in config/argocd/argocd-cm-patch.yaml: keep both equal.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpushare controller to report status"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the gpushare controller to observe generation " .. tostring(generation) ..
    " (status describes " .. tostring(observed or "none") .. ")"
  return hs
end

local ready = nil
local degraded = nil
for _, condition in ipairs(obj.status.conditions) do
  if condition.type == "Ready" then
    ready = condition
  elseif condition.type == "Degraded" then
    degraded = condition
  end
end

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "Degraded") .. ": " .. (degraded.message or "")
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = (ready.reason or "NotReady") .. ": " .. (ready.message or "")
else
  hs.message = "Waiting for the Ready condition"
end
return hs
