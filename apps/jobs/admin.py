from apps.core.admin import ReadOnlyAdmin, register
from apps.jobs import models as m

# A job's status moves only through its state machine (jobs.services), which writes the transition.
register(m.Job, m.JobTransition, m.JobLogLine, admin_class=ReadOnlyAdmin)
