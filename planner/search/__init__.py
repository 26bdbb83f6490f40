"""Deprecated: the planner's passes moved to :mod:`reshard.planner.passes` (issue 65,
item 5: not to be taken for the stage search, :mod:`reshard.search`); the old paths
import for one release with a DeprecationWarning and give the moved modules' objects."""
