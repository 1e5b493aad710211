-- Argo CD health check for erasure.lethe.dev/ErasureRequest.
-- Healthy once the request reached a final state; Degraded when it failed or a
-- human must act (Stalled); Suspended while it waits by design (the grace
-- period, backups expiring), so an Application is not held Progressing for
-- weeks; Progressing while Lethe works or has not seen the latest spec.
local hs = {}

local function condition(t)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == t then
      return c
    end
  end
  return nil
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "waiting for Lethe to pick the request up"
  return hs
end
if obj.metadata.generation ~= nil and (obj.status.observedGeneration or 0) < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Lethe has not yet seen the latest spec"
  return hs
end

local phase = obj.status.phase
if phase == "BackupsRotated" or phase == "Planned" or phase == "Cancelled" then
  hs.status = "Healthy"
  local ready = condition("Ready")
  hs.message = phase .. (ready ~= nil and (": " .. ready.message) or "")
  return hs
end
local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = "a human must act: " .. stalled.message
  return hs
end
local grace = condition("GracePeriodElapsed")
if grace ~= nil and grace.status == "False" and grace.reason == "WaitingForGracePeriod" then
  hs.status = "Suspended"
  hs.message = "waiting for the grace period to end at " .. (obj.status.graceEndsAt or "?") .. " (set spec.cancel to undo)"
  return hs
end
local backups = condition("BackupsRotated")
if backups ~= nil and backups.status == "False" and backups.reason == "BackupsExpiring" then
  hs.status = "Suspended"
  hs.message = "waiting for backups to expire: " .. backups.message
  return hs
end
hs.status = "Progressing"
local ready = condition("Ready")
hs.message = ready ~= nil and ready.message or phase
return hs
