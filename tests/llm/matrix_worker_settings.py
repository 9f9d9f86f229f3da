"""Settings of the provider matrix's Celery workers: the suite's worker settings, with the
site of one (provider, streaming) pair (``tests.llm.matrix.site_aaa``) wired from
settings alone (no ``WORKER_SETUP``) and no periodic duty (it would take other tests'
runs onto a worker without their handlers)."""

import os

from tests.celery.worker_settings import *  # noqa: F403
from tests.celery.worker_settings import AAA
from tests.llm.matrix import site_aaa

AAA.pop("WORKER_SETUP", None)
AAA["DUTY_EVERY"] = 0
AAA.update(
    site_aaa(
        os.environ["AAA_TEST_MATRIX_PROVIDER"],
        os.environ["AAA_TEST_MATRIX_STREAM"] == "1",
        os.environ["AAA_TEST_MATRIX_URL"],
        os.environ["AAA_TEST_MATRIX_MCP_URL"],
    )
)
