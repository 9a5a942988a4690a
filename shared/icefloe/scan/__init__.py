"""Scan planning: which files a scan reads, with their deletes and residual filters
(planning), the plan as selected manifest rows (plan), and its tasks as the REST
catalog's ScanTasks JSON (tasks_json)."""
