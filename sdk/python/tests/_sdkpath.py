"""Put the checkout's levers9 package first on sys.path, so the tests run
against it whether or not a levers9 is installed. Every test module imports
this first."""

import os
import sys

SDK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[:1] != [SDK_DIR]:
    sys.path.insert(0, SDK_DIR)
