# A spot job billed at the spot price it pays (issue 45): its $/h to 6 places, as EC2 quotes spot, and the rates its
# cluster was billed at over its life.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0027_bundle_cuda"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="hourly_cost",
            field=models.DecimalField(
                blank=True,
                decimal_places=6,
                help_text="$/h its cluster is billed at now (PS + workers): a spot job's at its spot price",
                max_digits=14,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="rates",
            field=models.JSONField(blank=True, default=list),
        ),
    ]
