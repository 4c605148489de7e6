from apps.core.admin import ReadOnlyAdmin, register
from apps.experiments import models as m

# Scores, integrity status and the event log change only through services (audited); the admin shows them.
register(
    m.Experiment,
    m.Checkpoint,
    m.Evaluation,
    m.EvaluationSample,
    m.MetricPoint,
    m.Event,
    m.EventChain,
    m.ExperimentEdge,
    m.IntegrityStatusChange,
    admin_class=ReadOnlyAdmin,
)
