from apps.core.admin import ReadOnlyAdmin, register
from apps.expos import models as m

register(m.AgentToken, m.IdempotencyRecord, admin_class=ReadOnlyAdmin)
