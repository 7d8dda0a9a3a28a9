// compose_check: what `docker compose config -q` checks, with the library that command is
// built on (github.com/compose-spec/compose-go/v2): it loads the compose file, interpolates
// the environment, merges anchors and validates the result against the Compose
// Specification's JSON schema and its semantic rules. Exit 0 if valid, 1 (the reason on
// stderr) if not. Used by scripts/check_compose.sh; no Docker engine or compose plugin needed.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: compose_check COMPOSE_FILE...")
		os.Exit(2)
	}
	opts, err := cli.NewProjectOptions(os.Args[1:], cli.WithOsEnv, cli.WithName("memstream"))
	if err == nil {
		_, err = opts.LoadProject(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "invalid compose file:", err)
		os.Exit(1)
	}
}
