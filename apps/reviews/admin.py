from apps.core.admin import ReadOnlyAdmin, register
from apps.reviews import models as m

register(m.ReviewReport, admin_class=ReadOnlyAdmin)
