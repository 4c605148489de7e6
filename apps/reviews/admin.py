from apps.core.admin import NoDeleteAdmin, register
from apps.reviews import models as m

register(m.ReviewReport, admin_class=NoDeleteAdmin)
