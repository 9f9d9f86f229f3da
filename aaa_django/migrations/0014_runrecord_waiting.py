# The run index's status "waiting" (a run waiting for a person), and the permission to
# answer any run's questions: choices and options only, no SQL.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('aaa', '0013_runrecord_lease'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='runrecord',
            options={'permissions': [('view_all_runs', 'Can see every run, not only their own'), ('cancel_run', 'Can cancel any run'), ('approve_run', "Can grant or deny any run's approvals"), ('answer_run', "Can answer any run's questions"), ('erase_run', 'Can erase any run'), ('import_run', 'Can import runs from an export file')], 'verbose_name': 'run'},
        ),
        migrations.AlterField(
            model_name='runrecord',
            name='status',
            field=models.CharField(choices=[('pending', 'pending'), ('running', 'running'), ('waiting', 'waiting'), ('completed', 'completed')], max_length=16),
        ),
    ]
