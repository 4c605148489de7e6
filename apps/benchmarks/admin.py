from apps.benchmarks import models as m
from apps.core.admin import NoDeleteAdmin, register

register(m.Benchmark, admin_class=NoDeleteAdmin)
