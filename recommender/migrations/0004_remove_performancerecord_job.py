"""A record's link to the job that measured it is fc2's (fc2.JobRecord): fc2's migration that made it copied the links
first (it runs before this one: its `run_before`, so that nothing here names fc2)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("recommender", "0003_alter_instancetype_hourly_price"),
    ]

    operations = [
        migrations.RemoveField(model_name="performancerecord", name="job"),
    ]
