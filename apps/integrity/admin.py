from apps.core.admin import NoDeleteAdmin, ReadOnlyAdmin, register
from apps.integrity import models as m

register(m.IntegrityFinding, m.ReviewOverride, admin_class=NoDeleteAdmin)
register(m.FindingChange, m.BlockedAttempt, admin_class=ReadOnlyAdmin)
