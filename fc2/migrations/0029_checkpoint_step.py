# A checkpoint's own step (issue 45): the chief's step its agent saw it saved at, so that a restart counts the work
# lost from there rather than from the last progress line the platform had received before it.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fc2", "0028_spot_rates"),
    ]

    operations = [
        migrations.AddField(
            model_name="artifact",
            name="step",
            field=models.PositiveBigIntegerField(
                blank=True, help_text="A checkpoint's: the chief's step it was saved at, as its agent saw it", null=True
            ),
        ),
    ]
