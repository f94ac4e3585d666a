"""RPL's part of an evaluation report: results by task type (the paper's Table 3: F1 and dF1 per GlobalQA
type; open-domain questions are "qa")."""
from searchrl.task import Report

REPORT = Report(groups={"task_type": "task type"})
