from apps.core.admin import NoDeleteAdmin, ReadOnlyAdmin, register
from apps.datapool import models as m

register(m.DataEntry, admin_class=NoDeleteAdmin)
register(m.DataReadmeEntry, m.DataUsage, admin_class=ReadOnlyAdmin)
