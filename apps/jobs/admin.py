from apps.core.admin import NoDeleteAdmin, ReadOnlyAdmin, register
from apps.jobs import models as m

register(m.Job, admin_class=NoDeleteAdmin)
register(m.JobTransition, m.JobLogLine, admin_class=ReadOnlyAdmin)
