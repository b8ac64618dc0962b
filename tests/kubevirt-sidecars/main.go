// Command kubevirt-sidecars stands in, on the real-node lane only, for the two CSI sidecars that
// the kubevirt hostpath-provisioner-operator puts beside its CSI driver and that the Go module
// proxy does not serve (node-driver-registrar and livenessprobe: their go.mod paths lack the /v2
// suffix their tags need, so the proxy refuses every version). Without a registrar the kubelet
// never learns of the driver, and without the probe the driver container's liveness probe
// restarts it, so the kubevirt install could not run on the lane at all.
//
// Each does the one job the operator's DaemonSet gives its sidecar, with the flags it passes:
//
//	csi-node-driver-registrar --v=N --csi-address=/csi/csi.sock \
//	    --kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock
//	livenessprobe --csi-address=/csi/csi.sock --health-port=9898
//
// The program acts as the one its file is named after (the images copy it under both names).
// The real registrar also exposes its own health endpoint and re-registers when its socket
// vanishes; neither is used by the operator's DaemonSet.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	switch name := filepath.Base(os.Args[0]); name {
	case "csi-node-driver-registrar":
		registrar()
	case "livenessprobe":
		livenessProbe()
	default:
		log.Fatalf("run as csi-node-driver-registrar or livenessprobe, not %q", name)
	}
}

// dialDriver connects to the CSI driver's socket; the connection is made lazily by gRPC, so a
// driver that starts later is found by the first call after it listens.
func dialDriver(address string) *grpc.ClientConn {
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatalf("connecting to the CSI driver at %s: %v", address, err)
	}
	return conn
}

// registrar asks the driver its name, then serves the kubelet's plugin-registration API on
// /registration/<name>-reg.sock: the kubelet's plugin watcher finds the socket there, asks
// GetInfo, connects to the driver at the registration path and reports back.
func registrar() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket in this container")
	kubeletPath := flag.String("kubelet-registration-path", "", "the CSI driver's socket as the kubelet reaches it on the node")
	registrationDir := flag.String("plugin-registration-path", "/registration", "the kubelet's plugin registry directory in this container")
	flag.Int("v", 0, "log level (accepted for the operator's flags; this stand-in logs every step)")
	flag.Parse()
	if *kubeletPath == "" {
		log.Fatal("--kubelet-registration-path is required")
	}
	conn := dialDriver(*csiAddress)
	var driver string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			driver = info.GetName()
			break
		}
		log.Printf("asking the CSI driver at %s its name: %v (retrying)", *csiAddress, err)
		time.Sleep(2 * time.Second)
	}
	socket := filepath.Join(*registrationDir, driver+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		log.Fatalf("removing the old socket %s: %v", socket, err)
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatalf("listening on %s: %v", socket, err)
	}
	server := grpc.NewServer()
	registration.RegisterRegistrationServer(server, &registrationServer{driver: driver, endpoint: *kubeletPath})
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		server.Stop()
		_ = os.Remove(socket)
		os.Exit(0)
	}()
	log.Printf("serving the registration of %s (endpoint %s) on %s", driver, *kubeletPath, socket)
	if err := server.Serve(listener); err != nil {
		log.Fatalf("serving %s: %v", socket, err)
	}
}

type registrationServer struct {
	registration.UnimplementedRegistrationServer
	driver, endpoint string
}

func (s *registrationServer) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	log.Printf("the kubelet asked for the plugin's information")
	return &registration.PluginInfo{
		Type:              registration.CSIPlugin,
		Name:              s.driver,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, status *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !status.PluginRegistered {
		// As the real registrar does: a refused registration is fatal, and the kubelet restarts
		// the container to try again.
		log.Fatalf("the kubelet refused the registration of %s: %s", s.driver, status.Error)
	}
	log.Printf("the kubelet registered %s", s.driver)
	return &registration.RegistrationStatusResponse{}, nil
}

// livenessProbe answers /healthz on the health port with the driver's own Probe: 200 when the
// driver says it is ready, 500 with the reason otherwise.
func livenessProbe() {
	csiAddress := flag.String("csi-address", "/run/csi/socket", "the CSI driver's socket in this container")
	port := flag.Int("health-port", 9808, "the TCP port of /healthz")
	flag.Parse()
	conn := dialDriver(*csiAddress)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		answer, err := csi.NewIdentityClient(conn).Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, "probe of the CSI driver failed: %v\n", err)
		case answer.GetReady() != nil && !answer.GetReady().GetValue():
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintln(w, "the CSI driver is not ready")
		default:
			fmt.Fprintln(w, "ok")
		}
	})
	server := &http.Server{Addr: fmt.Sprintf(":%d", *port), ReadHeaderTimeout: 5 * time.Second}
	log.Printf("serving /healthz on :%d for the CSI driver at %s", *port, *csiAddress)
	log.Fatal(server.ListenAndServe())
}
