-- Argo CD health check for erasure.lethe.dev/MemoryStore: Healthy when every
-- configured layer is reachable and the schema is compliant, Degraded with
-- Lethe's reason otherwise, Progressing until Lethe has seen the latest spec.
local hs = {}
if obj.status == nil or obj.status.conditions == nil then
  hs.status = "Progressing"
  hs.message = "waiting for Lethe to check the store"
  return hs
end
if obj.metadata.generation ~= nil and (obj.status.observedGeneration or 0) < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Lethe has not yet checked the latest spec"
  return hs
end
for _, c in ipairs(obj.status.conditions) do
  if c.type == "Ready" then
    if c.status == "True" then
      hs.status = "Healthy"
    else
      hs.status = "Degraded"
    end
    hs.message = c.message
    return hs
  end
end
hs.status = "Progressing"
hs.message = "waiting for Lethe to check the store"
return hs
