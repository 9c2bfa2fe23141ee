"""What the operator offers and allows: languages (sandbox-images/*/language.yaml), named policies
and their ceilings (policies/*.yaml), and the hosts webhooks may call."""
