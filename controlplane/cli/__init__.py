"""twinectl, the command line of twine-controld: `controlplane.cli.twinectl:main`."""
