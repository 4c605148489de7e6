from apps.core.admin import NoDeleteAdmin, ReadOnlyAdmin, register
from apps.research import models as m

register(m.Run, m.ResearchNode, admin_class=NoDeleteAdmin)
register(m.Guidance, m.Prediction, m.Candidate)
register(m.ResearchEdge, m.Decision, m.OptimizerClaim, m.RunStatusChange, m.LLMUsage, admin_class=ReadOnlyAdmin)
