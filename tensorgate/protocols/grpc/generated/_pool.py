"""The private descriptor pool the generated stubs register in (see ``generate.py`` for why)."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
