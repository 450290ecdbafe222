"""Host preparation: Ansible playbooks (playbooks/) run through ansible-runner, and the facts they gather."""
