"""Tests of scalerun.topology: readers, parsers, and the comparison with torch --numa-binding."""
