"""A local package the test functions import: shipped with them."""
