package contract

// Namespaces of an installation (impl/config/controller/100-namespace.yaml).
const (
	// SystemNamespace holds the controllers, fiber-router, config-lampyr,
	// the installation's keys and the router metadata ConfigMaps.
	SystemNamespace = "lampyr-system"
	// HomesNamespace holds the Homes (Pod, Service, Secret per grant)
	// unless the grant controller is told otherwise
	// (LAMPYR_HOMES_NAMESPACE).
	HomesNamespace = "lampyr-homes"
	// SystemNamespaceEnv overrides SystemNamespace in the controllers.
	SystemNamespaceEnv = "LAMPYR_NAMESPACE"
)

// Objects in SystemNamespace that more than one component reads or writes
// (docs/security.md "Where things live"). None of the key Secrets is ever
// copied to another namespace.
const (
	// ConfigMapName is config-lampyr, read by both controllers and ly.
	ConfigMapName = "config-lampyr"
	// RouterServiceName is fiber-router's Service; Revision backends point at it.
	RouterServiceName = "fiber-router"
	// GrantControllerName is the grant controller's Deployment. Its leader
	// election lease is named by knative.dev/pkg after the reconciler's Go
	// type (grant-controller.lampyr.dev.serving.impl.grant.reconciler.00-of-01).
	GrantControllerName = "lampyr-grant-controller"
	// ControllerName is the Lampyr Revision controller: the managed-by label
	// value on what it creates, and its identity as a template sealer.
	ControllerName = "lampyr-controller"

	// FleetKeyName is the Secret with the fleet private key
	// (FleetPrivateKeyKey, retired keys RetiredFleetKeyPrefix+...) and the
	// ConfigMap publishing its public half (FleetPublicKeyKey) for ly.
	FleetKeyName = "lampyr-fleet-key"
	// GrantSigningKeyName is the Secret with the grant controller's signing key.
	GrantSigningKeyName = "lampyr-grant-signing-key"
	// RouterKeyName is the Secret with fiber-router's key (mounted by the
	// router; Homes get its public half).
	RouterKeyName = "fiber-router-key"
	// ControllerSealerName is the Secret with the Revision controller's
	// sealer key (templates of image-mapped Revisions); trusted for every
	// namespace.
	ControllerSealerName = "lampyr-controller-sealer"
	// SealersConfigMap lists the sealer identities administrators
	// authorized, and for which namespaces (seal.ParseSealers): one key per
	// identity name.
	SealersConfigMap = "lampyr-template-sealers"
)

// Keys of the fleet key Secret and ConfigMap, and of the other key Secrets.
const (
	FleetPrivateKeyKey = "private.pem"
	FleetPublicKeyKey  = "public.pem"
	FleetKeyIDKey      = "keyID"
	// RetiredFleetKeyPrefix starts the keys of retired fleet private keys
	// (RetiredFleetKeyPrefix + the first 16 hex of their key ID + ".pem"),
	// kept so templates sealed to them still open after a rotation.
	RetiredFleetKeyPrefix = "retired-"
	// PrivateKeyKey and PublicKeyKey hold the halves of the signing key,
	// the router key and the controller's sealer key.
	PrivateKeyKey = "private.pem"
	PublicKeyKey  = "public.pem"
)
