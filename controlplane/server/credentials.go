package server

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/levers9/levers9/internal/seaweed"
)

// SeaweedFSCredentialsCommand is the subcommand that copies a SeaweedFS
// cluster's credentials into volumes.seaweedfs.securityDir.
const SeaweedFSCredentialsCommand = "seaweedfs-credentials"

// seaweedFSCredentials is `levers9-controlplane seaweedfs-credentials
// --from DIR --to DIR`, the chart's init container: it copies the
// credentials of a mounted Secret into the controlplane's own 0600 files
// (seaweed.CopySecurity says why a Secret cannot be read in place) and
// checks them as the controlplane will at start. The image has no shell
// or cp, and a copy by this binary is one the tests run.
func seaweedFSCredentials(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("levers9-controlplane "+SeaweedFSCredentialsCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("from", "", "the directory holding the credential files (a mounted Secret)")
	to := fs.String("to", "", "the directory to copy them into (volumes.seaweedfs.securityDir)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: levers9-controlplane %s --from DIR --to DIR\n\nCopies a SeaweedFS cluster's credential files (%v) into DIR as 0600 files of this user, and checks them.\n\n",
			SeaweedFSCredentialsCommand, seaweed.SecurityFiles())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *from == "" || *to == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New(SeaweedFSCredentialsCommand + ": --from and --to are required, and nothing else")
	}
	if _, err := seaweed.CopySecurity(*from, *to); err != nil {
		return fmt.Errorf("%s: %w", SeaweedFSCredentialsCommand, err)
	}
	fmt.Fprintf(stdout, "copied %d SeaweedFS credential files from %s to %s\n", len(seaweed.SecurityFiles()), *from, *to)
	return nil
}
