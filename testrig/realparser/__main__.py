"""Manual check: ``python -m testrig.realparser VERSION ARGV...`` prints what that SGLang parses."""
import json
import logging
import sys

from testrig.realparser import parse_with_real_sglang

logging.basicConfig(level=logging.INFO, format="%(message)s")
print(json.dumps(parse_with_real_sglang(sys.argv[1], sys.argv[2:]), indent=1, sort_keys=True))
