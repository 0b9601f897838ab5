"""MetaSchedule schedule rules of edgetune, registered as TVM global functions when imported."""
