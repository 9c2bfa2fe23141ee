"""The test tree.

The Redis ACL is derived from the key schema's rows, which `execbox.keyschema` hands to
`execbox.core.redis_roles` when imported, and tests/conftest.py's `write_acl` calls `acl_file`
without them: importing the schema here gives every test session (one integration file alone
included) the full ACL, until `write_acl` passes `execbox.keyschema.SCHEMA` itself.
"""

import execbox.keyschema  # noqa: F401
