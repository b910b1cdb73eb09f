"""pytest plugin: starts the official Datastore emulators and gives fixtures."""
