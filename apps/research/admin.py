from apps.core.admin import ReadOnlyAdmin, register
from apps.research import models as m

# Runs, nodes, decisions, guidance and predictions change through the research services only.
register(
    m.Run,
    m.ResearchNode,
    m.Guidance,
    m.Prediction,
    m.Candidate,
    m.ResearchEdge,
    m.Decision,
    m.OptimizerClaim,
    m.RunStatusChange,
    m.LLMUsage,
    m.AgentLoop,
    admin_class=ReadOnlyAdmin,
)
