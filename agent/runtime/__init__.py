"""Container runtimes. The agent talks to a `ContainerRuntime`; Docker is the real one."""
