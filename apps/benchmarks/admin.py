from apps.benchmarks import models as m
from apps.core.admin import ReadOnlyAdmin, register

# A benchmark names its sealed data and reference; it is installed by a command, never edited here.
register(m.Benchmark, admin_class=ReadOnlyAdmin)
