# The run index's status "waiting" (a run waiting for a person): choices only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('aaa', '0011_read_from_snapshot_function'),
    ]

    operations = [
        migrations.AlterField(
            model_name='runrecord',
            name='status',
            field=models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('waiting', 'waiting'), ('completed', 'completed')], max_length=16),
        ),
    ]
