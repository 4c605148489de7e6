from apps.core.admin import ReadOnlyAdmin, register
from apps.datapool import models as m

register(m.DataEntry, m.DataReadmeEntry, m.DataUsage, admin_class=ReadOnlyAdmin)
