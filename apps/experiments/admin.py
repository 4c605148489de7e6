from apps.core.admin import NoDeleteAdmin, ReadOnlyAdmin, register
from apps.experiments import models as m

register(m.Experiment, m.Checkpoint, m.Evaluation, admin_class=NoDeleteAdmin)
register(
    m.Event, m.EventChain, m.ExperimentEdge, m.IntegrityStatusChange, m.EvaluationSample, admin_class=ReadOnlyAdmin
)
