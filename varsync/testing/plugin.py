"""pytest plugin (entry point ``pytest11``): placeholder until the suite lands."""
